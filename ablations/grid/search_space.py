"""A grid's `[search]`: its space (one `Dimension` per searched key), checked against the rest of
the grid, and its groups (the product of tasks x sizes x mechanisms x the other swept values,
on the search's seed), whose trials ablations/run/search.py chooses and runs."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from ablations.grid.expand import Base, assignments, bases
from ablations.grid.validate import SpecError, check_keys, check_setting, same_value

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - Python 3.10
    pass

from ablations.grid.cell import (
    LENGTH,
)
from ablations.grid.schema import (
    PRUNER_KEYS,
    PRUNERS,
    GridFile,
    Search,
)


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


RANGE_KEYS = ("low", "high", "log", "int")


def _dimension(path, key: str, table: dict) -> Dimension:
    """search.space.`key`'s distribution, checked: `{ choices = [...] }` (distinct values) or
    `{ low = a, high = b }` with a < b, and `log = true` (a > 0) or `int = true` (whole a, b);
    every value a valid one of `key`."""
    where = f"search.space.{key}"
    valid = ["choices"] if "choices" in table else list(RANGE_KEYS)
    check_keys(path, f"{where}.", table, valid, " (choices, or low, high, log, int)")
    if "choices" in table:
        choices = table["choices"]
        if not isinstance(choices, list) or not choices:
            raise SpecError(f"{path}: {where}.choices = {choices!r} must be a non-empty list")
        for i, value in enumerate(choices):
            at = f"{where}.choices[{i}]"
            if not isinstance(value, bool | int | float | str):
                raise SpecError(f"{path}: {at} = {value!r} must be a bool, int, float or str")
            check_setting(path, where, key, value, at)
            if any(same_value(value, other) for other in choices[:i]):
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
        check_setting(path, where, key, value, f"{where}.{name}")
    if not low < high:
        raise SpecError(f"{path}: {where}.low = {low!r} must be below high = {high!r}")
    if log and low <= 0:
        raise SpecError(f"{path}: {where}.low = {low!r} must be > 0 with log = true")
    return Dimension(key, low=low, high=high, log=log, integer=integer)


def check_search(
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
        for base in bases(grid)
        for values in assignments(base.sweep)
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
