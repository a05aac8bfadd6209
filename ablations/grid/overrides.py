"""`--set key=value` overrides of a grid file, applied to its parsed tables before validation:
dotted keys, list entries indexed, TOML values (``--set training.steps=50``,
``--set 'mechanisms[1].kwargs.n_heads=2'``)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator

from ablations.grid.cell import LENGTH
from ablations.grid.schema import GridFile
from ablations.grid.validate import (
    MAX_DEPTH,
    SpecError,
    check_depth,
    flat_sweep,
    same_value,
    step_name,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


_PART = re.compile(r"([A-Za-z0-9_-]+)((?:\[\d+\])*)")


def _steps(key: str, path) -> list[str | int]:
    """The parts of --set's dotted `key`, list indexes as ints: ["mechanisms", 1, "kwargs",
    "n_heads"]; SpecError for a part that is not a key."""
    steps: list[str | int] = []
    for part in key.split("."):
        match = _PART.fullmatch(part)
        if match is None:
            raise SpecError(
                f"{path}: --set {key!r}: {part!r} is not a key (letters, digits, '_', '-'), "
                f"optionally indexed, e.g. mechanisms[0].kwargs.n_heads"
            )
        steps += [match[1], *(int(i) for i in re.findall(r"\d+", match[2]))]
    return steps


def _value(text: str) -> object:
    """A --set's value: `text` as a TOML value, a bare word as that string; None where it is
    nested too deep for the parser."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        return None


def apply_overrides(raw: dict, overrides: list[str], path) -> dict:
    """`key=value` strings applied to the raw spec: a dotted key whose parts may index a list
    (``mechanisms[1].kwargs.n_heads=4``, ``sweep.training.lr=[1e-3,3e-3]``); TOML values,
    bare words as strings. A missing table is created; a list entry must exist."""
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"{path}: --set {item!r} must look like key=value")
        key, text = item.split("=", 1)
        value = _value(text)
        if value is None:
            raise SpecError(f"{path}: --set {key}: its value is nested more than {MAX_DEPTH} deep")
        check_depth(path, f"--set {key}", value)
        if key.count(".") >= MAX_DEPTH:
            raise SpecError(f"{path}: --set {key[:60]}...: a key of more than {MAX_DEPTH} parts")
        steps = _steps(key, path)
        target: object = raw
        for i, step in enumerate(steps[:-1]):
            where = step_name(steps[: i + 1])
            if isinstance(step, int):
                if not isinstance(target, list) or not 0 <= step < len(target):
                    size = len(target) if isinstance(target, list) else "no"
                    raise SpecError(f"{path}: --set {key}: {where} does not exist "
                                    f"({step_name(steps[:i])} has {size} entries)")  # fmt: skip
                target = target[step]
            else:
                if not isinstance(target, dict):
                    raise SpecError(f"{path}: --set {key}: {step_name(steps[:i])} is not a table")
                target = target.setdefault(step, [] if isinstance(steps[i + 1], int) else {})
        last = steps[-1]
        if isinstance(last, int):
            if not isinstance(target, list) or not 0 <= last < len(target):
                raise SpecError(f"{path}: --set {key}: {step_name(steps)} does not exist")
        elif not isinstance(target, dict):
            raise SpecError(f"{path}: --set {key}: {step_name(steps[:-1])} is not a table")
        target[last] = value
    return raw


# The fixed settings of the cells a --set may reach, by the first part of its key: how many
# parts name one setting (training.lr, sizes[0].dff, mechanisms[0].kwargs.n_heads)
SETTING_PARTS = {"training": 2, "model": 2, "sizes": 3, "tasks": 4, "mechanisms": 4}
ENTRY_TABLES = {"kwargs": None, "training": "training", "model": "model"}  # a task's or
# mechanism's fixed tables, and the section of a swept key they hold (None: its kwargs)


def _settings(steps: list[str | int], value: object) -> Iterator[tuple[list[str | int], object]]:
    """(key parts, value) of each fixed cell setting that a --set of `steps` to `value` sets:
    the key itself where it names one (``training.lr``), every setting inside a table or list
    it sets whole (``training={lr=...}``, ``sizes[0]={...}``, ``mechanisms=[...]``); none for a
    key that names no fixed setting of the cells (a sweep, a label, seeds, ...)."""
    parts = SETTING_PARTS.get(steps[0])
    entry = steps[0] in ("tasks", "mechanisms")
    if parts is None or (entry and len(steps) > 2 and steps[2] not in ENTRY_TABLES):
        return
    if len(steps) == parts:
        yield steps, value
    elif len(steps) < parts and isinstance(value, dict):
        for key, inner in value.items():
            yield from _settings([*steps, key], inner)
    elif len(steps) == 1 and parts > 2 and isinstance(value, list):  # sizes, tasks, mechanisms
        for index, inner in enumerate(value):
            yield from _settings([*steps, index], inner)


def _swept_key(steps: list[str | int]) -> tuple[str | None, int | None, str]:
    """(the table, its entry's index, the swept key) of a fixed setting's key parts
    (`_settings`): ["mechanisms", 0, "kwargs", "n_heads"] -> ("mechanisms", 0,
    "mechanism_kwargs.n_heads"); (None, None, "training.lr") for the grid's own tables."""
    if len(steps) == 2:
        return None, None, f"{steps[0]}.{steps[1]}"
    if steps[0] == "sizes":
        return "sizes", steps[1], f"model.{steps[2]}"
    table, index, section, name = steps
    section = ENTRY_TABLES[section] or f"{table[:-1]}_kwargs"
    return table, index, f"{section}.{name}"


def _toml_text(value: object) -> str:
    """`value` as a TOML value: an inline table for a dict, JSON's text for the rest."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_text(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def check_overrides_apply(grid: GridFile, overrides: list[str], path) -> None:
    """SpecError for a --set of a fixed setting that a sweep replaces in the cells it would set
    (a sweep beats a fixed value, ablations/grid/expand.py): ``--set
    'mechanisms[0].training.lr=3e-3'`` in a grid that sweeps training.lr would change nothing,
    nor would ``--set 'training={lr=3e-3}'`` or ``--set 'sizes[0].dff=128'`` where model.dff is
    swept. The message names the --set, the setting inside it, the sweep and the --set that
    does take effect."""
    for item in overrides:
        key, text = item.split("=", 1)
        steps = _steps(key, path)
        _check_sweep_not_replaced(grid, item, steps, _value(text), path)
        inside = _setting_around(steps)
        if inside is not None:  # a key inside one setting's table: mask_mod.window
            shown = "{" + f"{'.'.join(map(str, steps[len(inside) :]))} = {text}, ...}}"
            what = f"--set {item} (inside {step_name(inside)})"
            _check_not_swept(grid, what, inside, shown, path)
            continue
        for setting, value in _settings(steps, _value(text)):
            shown = text if setting == steps else _toml_text(value)
            inner = "" if setting == steps else f" (its {step_name(setting)} = {shown})"
            _check_not_swept(grid, f"--set {item}{inner}", setting, shown, path)
            _check_not_fixed_below(grid, f"--set {item}{inner}", setting, value, path)


def _check_sweep_not_replaced(grid: GridFile, item: str, steps: list, value: object, path) -> None:
    """SpecError where a --set of a sweep (the grid's [sweep] or a task's) sets a key that a
    more specific sweep replaces in cells it reaches (a task's or mechanism's sweep of a key
    replaces the grid's, a mechanism's a task's): ``--set 'sweep.training.lr=[1e-2]'`` on a
    grid whose task sweeps training.lr ran that task's cells at its own rates."""
    if steps[0] == "sweep":
        table, rest = None, steps[1:]
    elif steps[0] == "tasks" and len(steps) > 2 and steps[2] == "sweep":
        table, rest = "tasks", steps[3:]
    else:
        return
    if len(rest) >= 2:
        mine = {f"{rest[0]}.{rest[1]}": value}
    elif len(rest) == 1 and isinstance(value, dict):
        mine = {f"{rest[0]}.{key}": values for key, values in value.items()}
    elif not rest and isinstance(value, dict):
        mine = {f"{section}.{key}": values for section, inner in value.items()
                if isinstance(inner, dict) for key, values in inner.items()}  # fmt: skip
    else:
        return
    for other in _levels_below(table, ["tasks", "mechanisms"]):
        for i, entry in enumerate(getattr(grid, other)):
            theirs = flat_sweep(entry.sweep)
            found = next((k for k in mine if k in theirs and theirs[k] != mine[k]), None)
            if found is not None:
                raise SpecError(
                    f"{path}: --set {item} is overridden where {other}[{i}].sweep sweeps {found} "
                    f"(over {_toml_text(theirs[found])}) for its cells (a task's or mechanism's "
                    f"sweep of a key replaces the grid's, a mechanism's a task's); to sweep it "
                    f"there too, add --set '{other}[{i}].sweep.{found}={_toml_text(mine[found])}'"
                )


def _levels_below(table: str | None, order: list[str]) -> list[str]:
    """The entry tables of `order` (least to most specific) more specific than `table`: every
    one of them for the grid's own tables (`table` None or not in `order`)."""
    return order[order.index(table) + 1 :] if table in order else order


def _setting_around(steps: list[str | int]) -> list[str | int] | None:
    """The key parts of the fixed setting that a longer --set key reaches inside
    (``mechanisms[0].kwargs.mask_mod.window`` -> mechanisms[0].kwargs.mask_mod); None for a
    key that is one setting, a table of them, or none."""
    parts = SETTING_PARTS.get(steps[0])
    entry = steps[0] in ("tasks", "mechanisms")
    if parts is None or len(steps) <= parts or (entry and steps[2] not in ENTRY_TABLES):
        return None
    return steps[:parts]


def _check_not_fixed_below(grid: GridFile, what: str, steps: list, value: object, path) -> None:
    """SpecError where a more specific table of the grid fixes the setting `steps` (`_settings`)
    to another value in cells it reaches (fixed settings resolve grid < size < task <
    mechanism, ablations/grid/expand.py): ``--set training.steps=50`` on a grid whose task
    entry sets ``training = { steps = 600 }`` trains that task's cells 600 steps. `what`: the
    --set as the message names it."""
    table, index, key = _swept_key(steps)
    section, name = key.split(".", 1)
    if section not in ("training", "model"):
        return  # a task's or mechanism's kwargs: no level below it
    names = LENGTH if section == "training" and name in LENGTH else (name,)
    order = ["sizes", "tasks", "mechanisms"] if section == "model" else ["tasks", "mechanisms"]
    for other in _levels_below(table, order):
        for i, entry in enumerate(getattr(grid, other)):
            fixed = entry if other == "sizes" else getattr(entry, section)
            set_here = fixed.model_dump(exclude_unset=True)
            found = next((n for n in names if n in set_here), None)
            if found is None or (found == name and same_value(set_here[found], value)):
                continue
            where = f"{other}[{i}]" + ("" if other == "sizes" else f".{section}")
            fix = (
                f"to set it there too, add --set '{where}.{name}={_toml_text(value)}'"
                if found == name
                else f"steps and epochs are one setting: change {where}.{found} in the grid file"
            )
            raise SpecError(
                f"{path}: {what} is overridden where {where} sets {found} = "
                f"{_toml_text(set_here[found])} for its cells (a size's, task's or mechanism's "
                f"table beats the grid's, a mechanism's beats a task's); {fix}"
            )


def _check_not_swept(grid: GridFile, what: str, steps: list, shown: str, path) -> None:
    """SpecError where a sweep reaching the cells that the fixed setting `steps` (`_settings`)
    sets sweeps its key; `what`: the --set, as the message names it; `shown`: its value."""
    table, index, key = _swept_key(steps)
    lengths = [f"training.{k}" for k in LENGTH]  # steps and epochs: one setting
    keys = lengths if key in lengths else [key]
    searched = next((k for k in keys if grid.search and k in grid.search.space), None)
    if searched is not None:
        raise SpecError(
            f"{path}: {what} is overridden where [search] samples {searched} (from "
            f"{_toml_text(grid.search.space[searched])}): a searched key beats a fixed value; to "
            f"run {shown} alone, take {searched} out of search.space in the grid file"
        )
    levels = {"[sweep]": grid.sweep}  # every sweep that reaches cells the setting reaches
    for other in ("tasks", "mechanisms"):
        for i, entry in enumerate(getattr(grid, other)):
            if other != table or i == index:
                levels[f"{other}[{i}].sweep"] = entry.sweep
    for where, sweep in levels.items():
        swept = flat_sweep(sweep)
        found = next((k for k in keys if k in swept), None)
        if found is None:
            continue
        # the --set that works: a sweep of the setting's own entry, where none is more
        # specific (a mechanism's beats a task's); else the sweep that beat it, for its cells
        own = table == "mechanisms" or (table == "tasks" and not where.startswith("mechanisms"))
        scope = f"{table}[{index}].sweep" if own else where.replace("[sweep]", "sweep")
        caveat = "" if own or table is None else (
            f" (which sets it in every cell {where} reaches, not only {table}[{index}]'s)"
        )  # fmt: skip
        raise SpecError(
            f"{path}: {what} is overridden where {where} sweeps {found} (over {swept[found]}): "
            f"a sweep beats a fixed value; to run {shown} alone, --set '{scope}.{key}=[{shown}]'"
            f"{caveat}"
        )
