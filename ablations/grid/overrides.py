"""`--set key=value` overrides of a grid file, applied to its parsed tables before validation:
dotted keys, list entries indexed, TOML values (``--set training.steps=50``,
``--set 'mechanisms[1].kwargs.n_heads=2'``)."""

from __future__ import annotations

import re
import sys

from ablations.grid.schema import GridFile
from ablations.grid.validate import MAX_DEPTH, SpecError, check_depth, flat_sweep, step_name

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


def check_overrides_apply(grid: GridFile, overrides: list[str], path) -> None:
    """SpecError for a --set of a fixed setting that a sweep replaces in the cells it would set
    (a sweep beats a fixed value, ablations/grid/expand.py): ``--set
    'mechanisms[0].training.lr=3e-3'`` in a grid that sweeps training.lr would change nothing.
    The message names the sweep and the --set that does take effect."""
    for item in overrides:
        steps = _steps(item.split("=", 1)[0], path)
        if steps[:1] in (["tasks"], ["mechanisms"]) and len(steps) == 4:
            table, index, section, name = steps
            section = {"kwargs": f"{table[:-1]}_kwargs"}.get(section, section)
        elif len(steps) == 2:
            (section, name), table, index = steps, None, None
        else:
            continue  # not a fixed setting of the cells (a sweep, a label, seeds, ...)
        key = f"{section}.{name}"
        levels = {"[sweep]": grid.sweep}  # every sweep that reaches cells the --set reaches
        for other in ("tasks", "mechanisms"):
            for i, entry in enumerate(getattr(grid, other)):
                if other != table or i == index:
                    levels[f"{other}[{i}].sweep"] = entry.sweep
        for where, sweep in levels.items():
            values = flat_sweep(sweep).get(key)
            if values is None:
                continue
            value = item.split("=", 1)[1]
            scope = f"{table}[{index}].sweep.{key}" if table else f"sweep.{key}"
            raise SpecError(
                f"{path}: --set {item} is overridden where {where} sweeps {key} (over "
                f"{values}): a sweep beats a fixed value; to run {value} alone, "
                f"--set '{scope}=[{value}]'"
            )
