"""A grid's expansion into cells: fixed settings resolve grid < size < task < mechanism
(`base_of`), a sweep beats a fixed value and a more specific sweep replaces a less specific one;
steps and epochs are one setting (an epoch count resolves to its steps, `cell_of`); include and
exclude rules add and remove cells (`expand`)."""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ablations.grid.validate import checked_task, flat_sweep, same_value

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - Python 3.10
    pass

from ablations.grid.cell import (
    LABEL_KEYS,
    LENGTH,
    Cell,
    set_training,
    training_from,
)
from ablations.grid.schema import (
    GridFile,
    MechanismEntry,
    SizeEntry,
    TaskEntry,
)


@dataclass
class Base:
    """What the cells of one (task, size, mechanism) share before sweeps: the training keys
    set (grid < task < mechanism), the size with its model options (grid < size < task <
    mechanism), and the swept keys with their values (grid < task < mechanism; a sweep
    overrides a fixed value at any level)."""

    task: TaskEntry
    size: dict
    mechanism: MechanismEntry
    training: dict
    sweep: dict[str, list]


def base_of(file: GridFile, task: TaskEntry, size: SizeEntry, mech: MechanismEntry) -> Base:
    training: dict = {}
    for level in (file.training, task.training, mech.training):
        for key, value in level.model_dump(exclude_unset=True).items():
            set_training(training, key, value)
    options = {}
    for level in (file.model, size, task.model, mech.model):
        options.update(level.model_dump(exclude_unset=True))
    sized = {"label": size.label, "d_model": size.d_model, "n_layers": size.n_layers}
    sweep: dict[str, list] = {}
    for level in (file.sweep, task.sweep, mech.sweep):
        for key, values in flat_sweep(level).items():
            if key.removeprefix("training.") in LENGTH:
                sweep.pop("training.steps", None)
                sweep.pop("training.epochs", None)
            sweep[key] = values
    return Base(task, {**sized, **options}, mech, training, sweep)


def bases(file: GridFile) -> Iterator[Base]:
    for task, size, mech in itertools.product(file.tasks, file.sizes, file.mechanisms):
        yield base_of(file, task, size, mech)


def expand(
    path: Path, file: GridFile, exclude: list[dict], include: list[dict]
) -> tuple[list[Cell], list[int]]:
    """The grid's cells, and the indices of the exclude rules that matched no cell of the
    product (`load_grid` refuses those)."""
    cells: dict[str, Cell] = {}
    unmatched = set(range(len(exclude)))
    for base in bases(file):
        for values in assignments(base.sweep):
            for seed in file.seeds:
                cell = cell_of(path, file.name, base, values, seed)
                matched = {i for i, rule in enumerate(exclude) if _matches(rule, cell)}
                unmatched -= matched
                if not matched:
                    cells.setdefault(cell.key, cell)
    for rule in include:
        base = base_of(file, *(
            _by_label(getattr(file, f"{key}s"))[rule[key]] for key in ("task", "size", "mechanism")
        ))  # fmt: skip
        fixed = {k: v for k, v in rule.items() if k not in LABEL_KEYS}
        sweep = {k: v for k, v in base.sweep.items() if k not in fixed}
        for values in assignments(sweep):
            cell = cell_of(path, file.name, base, {**values, **fixed}, rule["seed"])
            cells.setdefault(cell.key, cell)
    return list(cells.values()), sorted(unmatched)


def cell_of(path: Path, grid: str, base: Base, values: dict, seed: int) -> Cell:
    """The cell of `base` with swept keys at `values`, for `seed`."""
    training, size = dict(base.training), dict(base.size)
    task_kwargs, mech_kwargs = dict(base.task.kwargs), dict(base.mechanism.kwargs)
    for key, value in values.items():
        section, _, name = key.partition(".")
        if section == "training":
            set_training(training, name, value)
        else:
            target = {"model": size, "task_kwargs": task_kwargs}.get(section, mech_kwargs)
            target[name] = value
    training = training_from(training)
    if training.epochs is not None:  # steps per epoch: the task's training-set size in batches
        n_train = checked_task(path, base.task.label, base.task.name, task_kwargs).n_train
        steps = training.epochs * math.ceil(n_train / training.batch_size)
        training = training.model_copy(update={"steps": steps})
    return Cell(
        grid, base.task.label, base.task.name, task_kwargs, size, base.mechanism.label,
        base.mechanism.name, mech_kwargs, training, seed, tuple(values),
        str(path.resolve().parent),
    )  # fmt: skip


def swept_keys_of(file: GridFile, include: list[dict]) -> list[str]:
    """Every swept key of the grid (any level, or named by an include), in order."""
    keys = [k for base in bases(file) for k in base.sweep]
    keys += [k for rule in include for k in rule if k not in LABEL_KEYS]
    return list(dict.fromkeys(keys))


def assignments(sweep: dict[str, list]) -> Iterator[dict]:
    """Every assignment of the swept keys to one of their values (one empty one: no sweep)."""
    for combo in itertools.product(*sweep.values()):
        yield dict(zip(sweep, combo, strict=True))


def _matches(rule: dict, cell: Cell) -> bool:
    return all(same_value(cell.setting(key), value) for key, value in rule.items())


def _by_label(entries: list) -> dict:
    return {entry.label: entry for entry in entries}
