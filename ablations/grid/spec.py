"""Loading a grid: a TOML (or Python) file naming tasks, model sizes, mechanisms, training
settings and seeds, `--set` overrides applied, validated whole before anything runs, and
expanded into cells once (`GridSpec.cells`, ablations/grid/cell.py).

The file's format: docs/grids.md (how it works) and docs/grid_reference.md (every key, generated
from the schema in ablations/grid/schema.py by ablations/grid/reference.py). The schema types
each table; this module adds the checks across fields: unknown keys and names, wrong types (a
bool is not an int; an int is a float), values out of range, duplicate seeds or labels,
include/exclude entries whose keys are neither labels (`LABEL_KEYS`) nor swept keys or whose
labels do not exist, and a grid with no cells are refused before anything is built or written.
Then each task of the grid is built with its kwargs and each (mechanism, size) pair as one
attention layer, cheaply, so a bad kwarg value is refused too, blamed on the task or the
mechanism it belongs to. Every error is a one-line `SpecError` naming the file, the key, the
bad value and the valid range or choices.

Expansion: fixed settings resolve grid < size < task < mechanism (`_base`), a sweep beats a
fixed value and a more specific sweep replaces a less specific one; steps and epochs are one
setting (an epoch count resolves to its steps, `_cell`). A `[search]` grid has no cells until
its trials are chosen (`SearchPlan`, `trial_cell`; running it: ablations/run/search.py).
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Annotated, Union, get_args, get_origin, get_type_hints

import torch
from pydantic import BaseModel, TypeAdapter, ValidationError, create_model

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ablations.grid.cell import (
    LABEL_KEYS,
    LENGTH,
    Cell,
    set_training,
    training_from,
)
from ablations.grid.cell_model import build_cell_model
from ablations.grid.devices import DEVICES, RESOURCE_DEFAULTS, device_problem, precision_problem
from ablations.grid.plugins import import_plugins, resolve
from ablations.grid.references import REFERENCES
from ablations.grid.schema import (
    PRUNER_KEYS,
    PRUNERS,
    RESUME_DEFAULTS,
    SECTIONS,
    SEED_RANGE,
    GridFile,
    GridRules,
    MechanismEntry,
    Search,
    Seed,
    Selection,
    SizeEntry,
    Sweep,
    TaskEntry,
    TrainingSettings,
    Valid,
    higher_is_better,
)
from ablations.results.tracking import TrackingPlan
from ablations.tasks import build_task, task_arguments
from ablations.tasks.registry import locate_files
from attn_zoo.mechanisms.registry import MECHANISMS
from attn_zoo.models.block import build_attention
from attn_zoo.registry import PluginError


class SpecError(ValueError):
    """A grid spec that cannot run, with the file, key, value and valid choices."""


def _flat(sweep: Sweep) -> dict[str, list]:
    """An entry's or the grid's sweep as {"section.key": values}."""
    return {
        f"{section}.{key}": values
        for section in SECTIONS
        for key, values in getattr(sweep, section).items()
    }


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


@dataclass
class GridSpec:
    """A grid as `load_grid` returns it: its settings, and its cells, expanded once (the
    product of tasks x sizes x mechanisms x swept values x seeds, minus grid.exclude, plus
    grid.include), in grid order."""

    path: Path
    name: str
    seeds: list[int]
    store: Path  # the store's path joined to the grid file's folder
    file: GridFile  # the validated file (labels filled in)
    training: TrainingSettings  # [training] as the cells of a grid without overrides hold it
    cells: list[Cell]
    swept_keys: list[str]  # every swept key (any level, or named by an include), in order
    checkpoints: bool = False
    resources: dict = field(default_factory=lambda: dict(RESOURCE_DEFAULTS))  # no cell's part
    selection: Selection | None = None
    imports: list[str] = field(default_factory=list)  # plugins, as workers import them
    resume: dict = field(default_factory=lambda: dict(RESUME_DEFAULTS))  # no cell's part
    tracking: TrackingPlan | None = None  # [tracking], its uri resolved; no cell's part
    search: SearchPlan | None = None  # [search]: `cells` is empty, the trials are in the store


@dataclass(frozen=True)
class Dimension:
    """One searched key and its distribution: `choices`, or a range [low, high] (`log`:
    uniform in log(value); `integer`: whole values)."""

    key: str
    choices: tuple = ()
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    integer: bool = False


@dataclass(frozen=True)
class SearchGroup:
    """The cells of one (task, size, mechanism, other swept values) of a search share
    `base` and `values`, and differ in the searched keys only; all train on `seed`."""

    base: Base
    values: dict
    seed: int


@dataclass(frozen=True)
class SearchPlan:
    """A grid's [search] resolved: its table, the distributions of its keys, the direction
    of its metric, its seed and startup trials, and its groups (in grid order)."""

    table: Search
    space: tuple[Dimension, ...]
    direction: str
    seed: int
    startup_trials: int
    groups: tuple[SearchGroup, ...]


def trial_cell(spec: GridSpec, group: SearchGroup, values: dict) -> Cell:
    """The cell of search `group` of `spec` with the searched keys at `values`."""
    return _cell(spec.path, spec.name, group.base, {**group.values, **values}, group.seed)


def search_probe(plan: SearchPlan) -> dict:
    """The searched values a search's groups are checked at (built by `load_grid`,
    smoke-tested by ablations.run.search.run_search): each key's first choice, or its low end."""
    return {d.key: d.choices[0] if d.choices else d.low for d in plan.space}


def _base(file: GridFile, task: TaskEntry, size: SizeEntry, mech: MechanismEntry) -> Base:
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
        for key, values in _flat(level).items():
            if key.removeprefix("training.") in LENGTH:
                sweep.pop("training.steps", None)
                sweep.pop("training.epochs", None)
            sweep[key] = values
    return Base(task, {**sized, **options}, mech, training, sweep)


def _bases(file: GridFile) -> Iterator[Base]:
    for task, size, mech in itertools.product(file.tasks, file.sizes, file.mechanisms):
        yield _base(file, task, size, mech)


def _expand(
    path: Path, file: GridFile, exclude: list[dict], include: list[dict]
) -> tuple[list[Cell], list[int]]:
    """The grid's cells, and the indices of the exclude rules that matched no cell of the
    product (`load_grid` refuses those)."""
    cells: dict[str, Cell] = {}
    unmatched = set(range(len(exclude)))
    for base in _bases(file):
        for values in _assignments(base.sweep):
            for seed in file.seeds:
                cell = _cell(path, file.name, base, values, seed)
                matched = {i for i, rule in enumerate(exclude) if _matches(rule, cell)}
                unmatched -= matched
                if not matched:
                    cells.setdefault(cell.key, cell)
    for rule in include:
        base = _base(file, *(
            _by_label(getattr(file, f"{key}s"))[rule[key]] for key in ("task", "size", "mechanism")
        ))  # fmt: skip
        fixed = {k: v for k, v in rule.items() if k not in LABEL_KEYS}
        sweep = {k: v for k, v in base.sweep.items() if k not in fixed}
        for values in _assignments(sweep):
            cell = _cell(path, file.name, base, {**values, **fixed}, rule["seed"])
            cells.setdefault(cell.key, cell)
    return list(cells.values()), sorted(unmatched)


def _cell(path: Path, grid: str, base: Base, values: dict, seed: int) -> Cell:
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
        n_train = _task(path, base.task.label, base.task.name, task_kwargs).n_train
        steps = training.epochs * math.ceil(n_train / training.batch_size)
        training = training.model_copy(update={"steps": steps})
    return Cell(
        grid, base.task.label, base.task.name, task_kwargs, size, base.mechanism.label,
        base.mechanism.name, mech_kwargs, training, seed, tuple(values),
        str(path.resolve().parent),
    )  # fmt: skip


def _swept_keys(file: GridFile, include: list[dict]) -> list[str]:
    """Every swept key of the grid (any level, or named by an include), in order."""
    keys = [k for base in _bases(file) for k in base.sweep]
    keys += [k for rule in include for k in rule if k not in LABEL_KEYS]
    return list(dict.fromkeys(keys))


def _assignments(sweep: dict[str, list]) -> Iterator[dict]:
    """Every assignment of the swept keys to one of their values (one empty one: no sweep)."""
    for combo in itertools.product(*sweep.values()):
        yield dict(zip(sweep, combo, strict=True))


def _matches(rule: dict, cell: Cell) -> bool:
    return all(_same(cell.setting(key), value) for key, value in rule.items())


def _same(a: object, b: object) -> bool:
    """Equal, with a bool never equal to an int (True == 1 in Python)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _by_label(entries: list) -> dict:
    return {entry.label: entry for entry in entries}


def _fail(path, key, value, valid, what: str = "") -> SpecError:
    valid = [str(v) for v in valid]
    close = difflib.get_close_matches(str(value), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return SpecError(
        f"{path}: {key} = {value!r} is not valid{what}.{hint} Valid: {', '.join(valid)}"
    )


def _check_keys(path, where, table: dict, valid, what: str = "") -> None:
    for key in table:
        if key not in valid:
            raise _fail(path, f"{where}{key} (key)", key, valid, what)


def _one_line(err: Exception) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def _parts(annotation: object) -> tuple[object, list[Valid]]:
    """The type under `Annotated` and `X | None`, and the `Valid`s annotating it."""
    valids = []
    while True:
        if get_origin(annotation) is Annotated:
            annotation, *meta = get_args(annotation)
            valids += [m for m in meta if isinstance(m, Valid)]
        elif get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation, valids


def _where(loc: tuple, root: type[BaseModel] = None) -> tuple[str, list[str], Valid | None]:
    """For an error's location in `root` (default `GridFile`): its key as the file writes it
    ("tasks[0].name"; a union member's tag left out), the keys its table may hold, and its
    `Valid`."""
    node, key, keys = root or GridFile, "", []
    for part in loc:
        base, _ = _parts(node)
        if isinstance(base, type) and issubclass(base, BaseModel) and part in base.model_fields:
            keys, node = list(base.model_fields), get_type_hints(base, include_extras=True)[part]
            key += f".{part}" if key else part
        elif isinstance(part, int) and get_origin(base) is list:
            node, key = get_args(base)[0], f"{key}[{part}]"
        elif isinstance(part, str) and get_origin(base) is dict:
            node, key = get_args(base)[1], f"{key}.{part}"
        else:  # the tag of a union member (int or float)
            break
    base, valids = _parts(node)
    if isinstance(base, type) and issubclass(base, BaseModel):
        keys = list(base.model_fields)
    return key, keys, (valids[0] if valids else None)


# A grid file's `imports` alone, validated before the rest (as GridFile types it)
_IMPORTS = create_model(
    "Imports", imports=(get_type_hints(GridFile, include_extras=True)["imports"], [])
)


def _spec_error(
    path, err: ValidationError, root: type[BaseModel] | None = None, key: str | None = None
) -> SpecError:
    """The first error of validating against `root` (default `GridFile`) as a one-line
    SpecError naming the key (or `key`, for a value validated alone), the value and what it
    may be."""
    error = err.errors()[0]
    loc, value = error["loc"], error["input"]
    if error["type"] == "extra_forbidden":
        parent, keys, _ = _where(loc[:-1], root)
        return _fail(path, f"{parent + '.' if parent else ''}{loc[-1]} (key)", loc[-1], keys)
    if error["type"] == "missing":
        parent = _where(loc[:-1], root)[0]
        return SpecError(f"{path}: {parent + ' is ' if parent else ''}missing {loc[-1]!r}")
    where, _, valid = _where(loc, root)
    where = key or where
    if error["type"] in ("model_type", "dict_type"):
        return SpecError(f"{path}: {where} = {value!r} must be a table, e.g. {{ key = value }}")
    if valid is not None and valid.choices:
        return _fail(path, where, value, valid.options())
    text = valid.text if valid is not None else error["msg"]
    return SpecError(f"{path}: {where} = {value!r} must be {text}")


_PART = re.compile(r"([A-Za-z0-9_-]+)((?:\[\d+\])*)")


def apply_overrides(raw: dict, overrides: list[str], path) -> dict:
    """`key=value` strings applied to the raw spec: a dotted key whose parts may index a list
    (``mechanisms[1].kwargs.n_heads=4``, ``sweep.training.lr=[1e-3,3e-3]``); TOML values,
    bare words as strings. A missing table is created; a list entry must exist."""
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"{path}: --set {item!r} must look like key=value")
        key, text = item.split("=", 1)
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        except RecursionError:
            value = None  # nested too deep for the parser: refused below
        if value is None:
            raise SpecError(f"{path}: --set {key}: its value is nested more than {MAX_DEPTH} deep")
        _check_depth(path, f"--set {key}", value)
        if key.count(".") >= MAX_DEPTH:
            raise SpecError(f"{path}: --set {key[:60]}...: a key of more than {MAX_DEPTH} parts")
        steps: list[str | int] = []
        for part in key.split("."):
            match = _PART.fullmatch(part)
            if match is None:
                raise SpecError(
                    f"{path}: --set {key!r}: {part!r} is not a key (letters, digits, '_', '-'), "
                    f"optionally indexed, e.g. mechanisms[0].kwargs.n_heads"
                )
            steps += [match[1], *(int(i) for i in re.findall(r"\d+", match[2]))]
        target: object = raw
        for i, step in enumerate(steps[:-1]):
            where = _step_name(steps[: i + 1])
            if isinstance(step, int):
                if not isinstance(target, list) or not 0 <= step < len(target):
                    size = len(target) if isinstance(target, list) else "no"
                    raise SpecError(f"{path}: --set {key}: {where} does not exist "
                                    f"({_step_name(steps[:i])} has {size} entries)")  # fmt: skip
                target = target[step]
            else:
                if not isinstance(target, dict):
                    raise SpecError(f"{path}: --set {key}: {_step_name(steps[:i])} is not a table")
                target = target.setdefault(step, [] if isinstance(steps[i + 1], int) else {})
        last = steps[-1]
        if isinstance(last, int):
            if not isinstance(target, list) or not 0 <= last < len(target):
                raise SpecError(f"{path}: --set {key}: {_step_name(steps)} does not exist")
        elif not isinstance(target, dict):
            raise SpecError(f"{path}: --set {key}: {_step_name(steps[:-1])} is not a table")
        target[last] = value
    return raw


MAX_DEPTH = 32  # tables and lists in a grid file or a --set value nest at most this deep


def _check_depth(path, what: str, value: object, depth: int = 0) -> None:
    """SpecError when `value` nests tables or lists more than `MAX_DEPTH` deep."""
    if depth > MAX_DEPTH:
        raise SpecError(f"{path}: {what} nests tables or lists more than {MAX_DEPTH} deep")
    children = value.values() if isinstance(value, dict) else value
    if isinstance(value, dict | list):
        for child in children:
            _check_depth(path, what, child, depth + 1)


def _step_name(steps: list[str | int]) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps).lstrip(".")


def _check_seeds(path, seeds: list[int]) -> None:
    first: dict[int, int] = {}
    for i, seed in enumerate(seeds):
        if seed in first:
            raise SpecError(
                f"{path}: seeds[{i}] = {seed!r} repeats seeds[{first[seed]}]; seeds must be "
                f"distinct (got {seeds})"
            )
        first[seed] = i


def _kwarg_names(entry: TaskEntry) -> list[str] | None:
    """The kwargs a task or mechanism entry may set (None: any)."""
    if not isinstance(entry, MechanismEntry):
        return task_arguments(entry.name)
    if entry.name in REFERENCES:
        return list(REFERENCES[entry.name].kwargs)
    valid = MECHANISMS.kwargs(entry.name)
    if valid is None:
        return None
    return [k for k in valid if k not in ("d_model", "backend")]  # the model fills them in


def _check_setting(path, where: str, key: str, value: object, at: str | None = None) -> None:
    """A swept or rule key ("training.lr", written at `where`) and one value of it (written at
    `at`, default `where`): the section and key must exist, a training or model value be valid
    for its key (kwargs are checked by building)."""
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name:
        raise _fail(path, f"{where} (key)", key, [*LABEL_KEYS, *(f"{s}.<key>" for s in SECTIONS)])
    table = SECTIONS[section]
    if table is None:
        return
    if name not in table.model_fields:
        raise _fail(path, f"{where} (key)", name, table.model_fields)
    try:
        table.model_validate({name: value})
    except ValidationError as err:
        raise _spec_error(path, err, table, at or where) from None


def _check_sweep(path, where: str, sweep: Sweep, entries: list[TaskEntry]) -> None:
    """Each swept key exists (a kwarg: for every entry of `entries` of its kind), and its
    values are valid and distinct."""
    for key, values in _flat(sweep).items():
        section, _, name = key.partition(".")
        at = f"{where}.{key}"
        for i, value in enumerate(values):
            _check_setting(path, at, key, value, f"{at}[{i}]")
            if any(_same(value, other) for other in values[:i]):
                raise SpecError(
                    f"{path}: {at}[{i}] = {value!r} repeats a value of {at} = {values!r}; "
                    f"a swept key's values must be distinct"
                )
        kind = {"task_kwargs": TaskEntry, "mechanism_kwargs": MechanismEntry}.get(section)
        for entry in entries:
            if kind is not None and type(entry) is kind:
                valid = _kwarg_names(entry)
                if valid is not None and name not in valid:
                    what = f" for {'mechanism' if kind is MechanismEntry else 'task'} "
                    raise _fail(path, f"{at} (key)", name, valid, what + repr(entry.label))


def _check_entries(path, key: str, entries: list[TaskEntry | SizeEntry]) -> None:
    """Labels (defaulting to the name) unique; kwargs keys of tasks and mechanisms known;
    their training (steps or epochs) and sweeps valid."""
    taken: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if isinstance(entry, TaskEntry):
            entry.label = entry.label or entry.name
            valid = _kwarg_names(entry)
            kind = "mechanism" if isinstance(entry, MechanismEntry) else "task"
            if valid is not None:
                what = f" for {kind} {entry.label!r}"
                _check_keys(path, f"{where}.kwargs.", entry.kwargs, valid, what)
            _check_length(path, f"{where}.training", entry.training)
            _check_sweep(path, f"{where}.sweep", entry.sweep, [entry])
        if entry.label in taken:
            raise SpecError(
                f"{path}: {where}.label = {entry.label!r} repeats {key}[{taken[entry.label]}]"
                f".label; labels must be unique within {key} (a label defaults to the name)"
            )
        taken[entry.label] = i


def _check_length(path, where: str, training: TrainingSettings) -> None:
    given = training.model_dump(exclude_unset=True)
    if "epochs" in given and "steps" in given:
        raise SpecError(
            f"{path}: {where}.epochs = {given['epochs']!r} and {where}.steps = "
            f"{given['steps']!r} are both set; set exactly one of them (an epoch is "
            f"ceil(n_train / batch_size) steps)"
        )


def _check_training(path, cells: list[Cell]) -> None:
    """Each distinct training of the cells: device and precision usable on this machine."""
    for device, precision in dict.fromkeys(
        (cell.training.device, cell.training.precision) for cell in cells
    ):
        problem = device_problem(device)
        if problem:
            raise SpecError(
                f"{path}: training.device = {device!r} is not available on this machine: "
                f'{problem} (valid: {DEVICES}, where available; "auto" takes CUDA where a '
                "worker has it)"
            )
        problem = precision_problem(precision, device)
        if problem:
            raise SpecError(
                f"{path}: training.precision = {precision!r} cannot be used with "
                f"training.device = {device!r}: {problem} (valid there: float32)"
            )


def _flat_rule(rule: dict) -> dict:
    """An include or exclude table with swept keys as written (``training.lr = 1e-3`` is
    {"training": {"lr": 0.001}} in TOML) flattened to {"training.lr": 0.001}."""
    flat = {}
    for key, value in rule.items():
        if key in SECTIONS and isinstance(value, dict):
            flat.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            flat[key] = value
    return flat


def _check_grid_rules(path, grid: GridRules, valid: dict[str, list]) -> tuple[list, list]:
    """grid.exclude and grid.include: tables of axes (task, size, mechanism, seed, swept
    keys); include names task, size, mechanism and seed (swept keys it leaves out take every
    value). Labels must exist; an excluded seed must be one of the seeds, an included one any
    seed; a swept key's value must be valid for its key."""
    rules = {}
    for kind in ("exclude", "include"):
        rules[kind] = [_flat_rule(rule_) for rule_ in getattr(grid, kind)]
        for i, rule_ in enumerate(rules[kind]):
            where = f"grid.{kind}[{i}]"
            if not rule_:
                raise SpecError(
                    f"{path}: {where} = {{}} must name one or more of {', '.join(LABEL_KEYS)} or "
                    f"swept keys"
                )
            if kind == "include" and not set(LABEL_KEYS) <= set(rule_):
                raise SpecError(
                    f"{path}: {where} = {rule_!r} must name all of {', '.join(LABEL_KEYS)}"
                )
            for axis, value in rule_.items():
                if axis not in LABEL_KEYS:
                    _check_setting(path, f"{where}.{axis}", axis, value)
                    continue
                if axis == "seed":
                    try:
                        TypeAdapter(Seed).validate_python(value, strict=True)
                    except ValidationError:
                        raise SpecError(
                            f"{path}: {where}.seed = {value!r} must be {SEED_RANGE}"
                        ) from None
                    if kind == "include":
                        continue
                if isinstance(value, bool) or value not in valid[axis]:
                    raise _fail(path, f"{where}.{axis}", value, valid[axis])
    return rules["exclude"], rules["include"]


def _check_selection(path, selection: Selection | None, swept: list[str], mechanisms: list) -> None:
    if selection is None:
        return
    for i, key in enumerate(selection.over):
        if key not in swept:
            raise _fail(path, f"selection.over[{i}]", key, swept or ["(no swept key)"])
    labels = [m.label for m in mechanisms]
    for i, pair in enumerate(selection.compare):
        for j, label in enumerate(pair):
            if label not in labels:
                raise _fail(path, f"selection.compare[{i}][{j}]", label, labels)
        if pair[0] == pair[1]:
            raise SpecError(
                f"{path}: selection.compare[{i}] = {pair!r} compares a mechanism with itself"
            )
    losses = [name for name in selection.reported_metrics if not higher_is_better(name)]
    if selection.equivalence_margin is not None and 0 < len(losses) < len(
        selection.reported_metrics
    ):
        raise SpecError(
            f"{path}: selection.equivalence_margin = {selection.equivalence_margin!r} is in the "
            f"units of every reported metric, and selection.reported = "
            f"{selection.reported_metrics!r} mixes losses ({', '.join(losses)}) with "
            "accuracies: valid is a margin with accuracies only or losses only"
        )


def _task(path, label: str, name: str, kwargs: dict):
    """Task `name` built with `kwargs` (cheap: no data), a relative data file looked up beside
    the grid file at `path` first; SpecError blaming task `label`."""
    try:
        return build_task(name, **locate_files(name, kwargs, path.resolve().parent))
    except Exception as err:
        raise SpecError(
            f"{path}: task {label!r} (name {name!r}) cannot be built with kwargs {kwargs}: "
            f"{_one_line(err)}"
        ) from err


def _check_builds(path, cells: list[Cell]) -> None:
    """Build each task with its kwargs, each (mechanism, size) as one attention layer, then
    each distinct model (cheap: no data, no training), turning any exception into a SpecError
    blaming the task, the mechanism, or the model options."""
    tasks, layers, models = {}, set(), set()
    with torch.random.fork_rng(devices=[]):  # leave the global RNG as it was
        for cell in cells:
            task_id = (cell.task, json.dumps(cell.task_kwargs, sort_keys=True, default=str))
            if task_id not in tasks:
                tasks[task_id] = _task(path, cell.task, cell.task_name, cell.task_kwargs)
                try:
                    tasks[task_id].check_size()
                except ValueError as err:
                    raise SpecError(
                        f"{path}: task {cell.task!r} (name {cell.task_name!r}) with kwargs "
                        f"{cell.task_kwargs}: {_one_line(err)}"
                    ) from None
            layer = json.dumps([cell.mechanism_name, cell.mechanism_kwargs, cell.size],
                               sort_keys=True, default=str)  # fmt: skip
            if layer not in layers and cell.mechanism_name not in REFERENCES:
                layers.add(layer)
                try:
                    build_attention(
                        cell.mechanism_name,
                        cell.size["d_model"],
                        cell.mechanism_kwargs,
                        cell.size.get("dropout", 0.0),
                        "auto",
                    )
                except Exception as err:
                    raise SpecError(
                        f"{path}: mechanism {cell.mechanism!r} (name {cell.mechanism_name!r}) "
                        f"cannot be built with kwargs {cell.mechanism_kwargs} at size "
                        f"{cell.size['label']!r} (d_model {cell.size['d_model']}): "
                        f"{_one_line(err)}"
                    ) from err
            model = f"{task_id}{layer}"
            if model not in models:
                models.add(model)
                try:
                    build_cell_model(cell, tasks[task_id])
                except Exception as err:
                    options = {k: v for k, v in cell.size.items() if k not in SIZE_FIELDS}
                    raise SpecError(
                        f"{path}: the model of task {cell.task!r}, size {cell.size['label']!r} "
                        f"and mechanism {cell.mechanism!r} cannot be built with model options "
                        f"{options}: {_one_line(err)}"
                    ) from err


SIZE_FIELDS = ("label", "d_model", "n_layers")

RANGE_KEYS = ("low", "high", "log", "int")


def _dimension(path, key: str, table: dict) -> Dimension:
    """search.space.`key`'s distribution, checked: `{ choices = [...] }` (distinct values) or
    `{ low = a, high = b }` with a < b, and `log = true` (a > 0) or `int = true` (whole a, b);
    every value a valid one of `key`."""
    where = f"search.space.{key}"
    valid = ["choices"] if "choices" in table else list(RANGE_KEYS)
    _check_keys(path, f"{where}.", table, valid, " (choices, or low, high, log, int)")
    if "choices" in table:
        choices = table["choices"]
        if not isinstance(choices, list) or not choices:
            raise SpecError(f"{path}: {where}.choices = {choices!r} must be a non-empty list")
        for i, value in enumerate(choices):
            at = f"{where}.choices[{i}]"
            if not isinstance(value, bool | int | float | str):
                raise SpecError(f"{path}: {at} = {value!r} must be a bool, int, float or str")
            _check_setting(path, where, key, value, at)
            if any(_same(value, other) for other in choices[:i]):
                raise SpecError(f"{path}: {at} = {value!r} repeats a value of {where}.choices")
        return Dimension(key, choices=tuple(choices))
    for name in ("low", "high"):
        if name not in table:
            raise SpecError(f"{path}: {where} is missing {name!r} (or give choices = [...])")
    low, high = table["low"], table["high"]
    log, integer = table.get("log", False), table.get("int", False)
    for name, flag in (("log", log), ("int", integer)):
        if not isinstance(flag, bool):
            raise SpecError(f"{path}: {where}.{name} = {flag!r} must be a bool")
    for name, value in (("low", low), ("high", high)):
        kinds = int if integer else int | float
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
            what = "an int (int = true)" if integer else "a finite number"
            raise SpecError(f"{path}: {where}.{name} = {value!r} must be {what}")
        _check_setting(path, where, key, value, f"{where}.{name}")
    if not low < high:
        raise SpecError(f"{path}: {where}.low = {low!r} must be below high = {high!r}")
    if log and low <= 0:
        raise SpecError(f"{path}: {where}.low = {low!r} must be > 0 with log = true")
    return Dimension(key, low=low, high=high, log=log, integer=integer)


def _check_search(
    path, grid: GridFile, swept: list[str], exclude: list, include: list
) -> SearchPlan | None:
    """[search] checked against the rest of the grid: its keys valid and swept nowhere else,
    no grid.include or grid.exclude; its groups (the product of tasks x sizes x mechanisms x
    the other swept values, on the search's seed)."""
    search = grid.search
    if search is None:
        return None
    if exclude or include:
        raise SpecError(
            f"{path}: grid.exclude and grid.include cannot be used with [search] (a search "
            f"runs every task, size and mechanism; split the grid instead)"
        )
    space = []
    for key, table in search.space.items():
        lengths = [f"training.{k}" for k in LENGTH]
        clash = [k for k in swept if k == key or (key in lengths and k in lengths)]
        if clash:
            raise SpecError(
                f"{path}: search.space.{key} is also swept ({clash[0]} in a [sweep]); a key is "
                f"either searched or swept, not both"
            )
        space.append(_dimension(path, key, table))
    trials = search.trials
    finite = math.prod(len(d.choices) or (d.high - d.low + 1 if d.integer else 0) for d in space)
    if finite and trials > finite:
        raise SpecError(
            f"{path}: search.trials = {trials} is more than the {finite} settings of "
            f"search.space; sweep them instead ([sweep])"
        )
    seed = grid.seeds[0] if search.seed is None else search.seed
    groups = tuple(
        SearchGroup(base, values, seed)
        for base in _bases(grid)
        for values in _assignments(base.sweep)
    )
    for pruner, keys in PRUNER_KEYS.items():
        for key in keys:
            value = getattr(search, key)
            if value is not None and search.pruner != pruner:
                raise SpecError(
                    f"{path}: search.{key} = {value!r} sets pruner = {pruner!r}, but "
                    f"search.pruner = {search.pruner!r}; valid: {', '.join(PRUNERS)}"
                )
    direction = search.direction or ("maximize" if search.metric == "val_acc" else "minimize")
    startup = search.startup_trials or min(10, max(2, trials // 4))
    return SearchPlan(search, tuple(space), direction, seed, startup, groups)


def load_grid(
    path: str | Path,
    overrides: list[str] | None = None,
    check_device: bool = True,
    imports: list[str] | None = None,
) -> GridSpec:
    """Read, override, validate and return the grid at `path`; raises SpecError.
    `check_device=False` accepts a device this machine lacks (to read the status or report of
    a grid trained elsewhere, e.g. on a GPU). The plugins the grid's `imports` and `imports`
    here (the CLI's --import, resolved against the working folder) name are imported first
    (ablations.grid.plugins), so that their names are valid."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as err:
        raise SpecError(f"{path}: cannot read the grid spec: {_one_line(err)}") from None
    _check_depth(path, "the grid spec", raw)
    raw = apply_overrides(raw, overrides or [], path)
    try:  # plugins first: the rest of the file may name what they register
        named = _IMPORTS.model_validate({"imports": raw.get("imports", [])}).imports
    except ValidationError as err:
        raise _spec_error(path, err, root=_IMPORTS) from None
    plugins = [*resolve(named, path.parent), *resolve(imports or [])]
    try:
        import_plugins(named, path.parent, f"{path.name} imports")
        import_plugins(imports or [], where="--import")
    except PluginError as err:
        raise SpecError(f"{path}: {err}") from None
    try:
        grid = GridFile.model_validate(raw)
    except ValidationError as err:
        raise _spec_error(path, err) from None
    _check_seeds(path, grid.seeds)
    for key in ("tasks", "sizes", "mechanisms"):
        _check_entries(path, key, getattr(grid, key))
    _check_length(path, "training", grid.training)
    _check_sweep(path, "sweep", grid.sweep, [*grid.tasks, *grid.mechanisms])
    valid = {
        "task": [t.label for t in grid.tasks],
        "size": [s.label for s in grid.sizes],
        "mechanism": [m.label for m in grid.mechanisms],
        "seed": grid.seeds,
    }
    exclude, include = _check_grid_rules(path, grid.grid, valid)
    given = {}
    for key, value in grid.training.model_dump(exclude_unset=True).items():
        set_training(given, key, value)
    swept_keys = _swept_keys(grid, include)
    search = _check_search(path, grid, swept_keys, exclude, include)
    if search is not None:
        swept_keys += [d.key for d in search.space]
    _check_selection(path, grid.selection, swept_keys, grid.mechanisms)
    cells, unmatched = _expand(path, grid, exclude, include)
    checked = cells
    if search is not None:  # no cells: the trials are chosen as the search runs
        checked = [_cell(path, grid.name, g.base, {**g.values, **search_probe(search)}, g.seed)
                   for g in search.groups]  # fmt: skip
        cells = []
    elif not cells:
        raise SpecError(
            f"{path}: grid.exclude = {grid.grid.exclude!r} leaves no cell of the product of "
            f"tasks x sizes x mechanisms x swept values x seeds and grid.include adds none; a "
            f"grid needs at least one cell"
        )
    if unmatched:
        i = unmatched[0]
        raise SpecError(f"{path}: grid.exclude[{i}] = {exclude[i]!r} matches no cell of the grid")
    if check_device:
        _check_training(path, checked)
    _check_builds(path, checked)
    tracking = None
    if grid.tracking is not None:  # its uri resolved from the grid file's folder
        tracking = TrackingPlan(tuple(grid.tracking.backends)).at(grid.tracking.uri, path.parent)
    return GridSpec(
        path,
        grid.name,
        grid.seeds,
        Path(os.path.normpath(path.parent / (grid.store or f"results/{grid.name}.sqlite"))),
        grid,
        training_from(given),
        cells,
        swept_keys,
        grid.checkpoints,
        grid.resources.model_dump(),
        grid.selection,
        plugins,
        grid.resume.model_dump(),
        tracking,
        search,
    )
