"""Searching a grid's settings with Optuna instead of sweeping their product: a grid's
`[search]` (ablations.schema.Search, checked by ablations.spec.load_grid).

    [search]
    trials = 8                                  # settings tried per (task, size, mechanism)
    space."training.lr" = { low = 1e-4, high = 3e-2, log = true }
    metric = "val_acc"                          # or "val_loss" (minimized)

    spec = load_grid("grid.toml")
    run_search(spec, workers=1)                 # `attn-zoo ablate run grid.toml`
    print(best_text(spec))                      # `attn-zoo ablate best grid.toml`

A search has groups: one per task, size, mechanism and values of the other swept keys
(`SearchPlan.groups`). Each trial of a group is a cell of the grid's store like any other
(ablations.spec.trial_cell: the group's cell with the searched keys at the trial's values, on
the search's seed), keyed by its resolved config: a trial proposed again is the same cell and
is not trained again. So resume, concurrent runs, `ablate status`, reports and their
[selection] read a searched grid as they read a swept one (`trial_spec`).

The store is the search's only record. Before each round of a group, its Optuna study is
rebuilt from the group's finished trial cells (`trials_of`: each a completed trial valued by
its `metric`, or a failed one where it is not done or its metric is not finite) and the sampler
is seeded from the search's seed, the group and the number of trials stored: the next
trials are a function of the store alone, so an interrupted search resumed proposes what an
uninterrupted one would have (`next_trials`). A round asks for up to `workers` new settings
(one by default, so that each trial is chosen knowing every trial before it), trains them with
`run_grid` and stores them; a group is done when it holds `trials` trial cells (finished or
training in another live run). Float values are rounded to 4 significant digits (readable
labels; a repeat is the same cell).

Not done: pruning (stopping a trial early on its validation curve): every trial trains its
full length.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import replace
from importlib.util import find_spec

from ablations.cell import Cell
from ablations.runner import run_grid
from ablations.spec import Dimension, GridSpec, SearchGroup, SpecError, trial_cell
from ablations.store import FINISHED, ResultsStore, claim_is_stale

MAX_ASKS = 100  # proposals of settings already tried, per round, before a group gives up


def _distribution(dimension: Dimension):
    """`dimension` as an Optuna distribution."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if dimension.choices:
        return CategoricalDistribution(dimension.choices)
    kind = IntDistribution if dimension.integer else FloatDistribution
    return kind(dimension.low, dimension.high, log=dimension.log)


def _rounded(value: object, dimension: Dimension) -> object:
    """A proposed value as the trial's cell holds it: a float to 4 significant digits, kept
    within [low, high]."""
    if not isinstance(value, float) or dimension.choices:
        return value
    return min(max(float(f"{value:.4g}"), dimension.low), dimension.high)


def _stored_rows(spec: GridSpec) -> list[dict]:
    """Every row of the grid's store, in the order the cells started; none without a store."""
    if not spec.store.exists():
        return []
    store = ResultsStore(spec.store, readonly=True)
    try:
        return list(store.rows())
    finally:
        store.close()


def trials_of(spec: GridSpec, group: SearchGroup, rows: list[dict]) -> list[tuple[Cell, dict]]:
    """The trials of `group` among the store's `rows`: the cells of the group whose searched
    values lie in the search's space, each with its row, in the order they started."""
    found = []
    space = spec.search.space
    for row in rows:
        if row["config"].get("seed") != group.seed:
            continue
        try:
            stored = Cell(**row["config"])
        except TypeError:  # a config of another shape: not a cell of this grid
            continue
        values = {d.key: stored.setting(d.key) for d in space}
        if not all(_contains(d, values[d.key]) for d in space):
            continue
        cell = trial_cell(spec, group, values)
        if cell.key == row["key"]:
            found.append((cell, row))
    return found


def _contains(dimension: Dimension, value: object) -> bool:
    if dimension.choices:
        return any(value == c and isinstance(value, bool) == isinstance(c, bool)
                   for c in dimension.choices)  # fmt: skip
    kinds = int if dimension.integer else int | float
    return (
        isinstance(value, kinds)
        and not isinstance(value, bool)
        and dimension.low <= value <= dimension.high
    )


def _metric(spec: GridSpec, row: dict) -> float | None:
    """The trial's value: its search metric where it is done and finite, else None."""
    value = (row.get("metrics") or {}).get(spec.search.table.metric)
    if row["status"] != "done" or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _sampler_seed(spec: GridSpec, group: SearchGroup, told: int) -> int:
    """The sampler's seed for a round of `group` after `told` stored trials (numpy's range)."""
    template = trial_cell(spec, group, {})
    text = json.dumps([spec.search.seed, template.key, told])
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def study_of(spec: GridSpec, group: SearchGroup, trials: list[tuple[Cell, dict]]):
    """The Optuna study of `group` rebuilt from its stored `trials` (`trials_of`): the finished
    ones told (completed with their metric, or failed), the sampler seeded by `_sampler_seed`."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    plan = spec.search
    finished = [(cell, row) for cell, row in trials if row["status"] in FINISHED]
    seed = _sampler_seed(spec, group, len(finished))
    if plan.table.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=plan.startup_trials)
    study = optuna.create_study(direction=plan.direction, sampler=sampler)
    distributions = {d.key: _distribution(d) for d in plan.space}
    for cell, row in finished:
        value = _metric(spec, row)
        state = optuna.trial.TrialState.FAIL if value is None else optuna.trial.TrialState.COMPLETE
        study.add_trial(
            optuna.trial.create_trial(
                params={d.key: cell.setting(d.key) for d in plan.space},
                distributions=distributions,
                value=value,
                state=state,
            )
        )
    return study


def next_trials(
    spec: GridSpec, group: SearchGroup, trials: list[tuple[Cell, dict]], count: int
) -> list[Cell]:
    """Up to `count` new trial cells of `group` (none stored), asked of the study rebuilt from
    its stored `trials`; fewer where the sampler keeps proposing settings already tried."""
    import optuna

    study = study_of(spec, group, trials)
    distributions = {d.key: _distribution(d) for d in spec.search.space}
    taken = {cell.key: row for cell, row in trials}
    new: dict[str, Cell] = {}
    for _ in range(MAX_ASKS):
        if len(new) == count:
            break
        trial = study.ask(distributions)
        values = {d.key: _rounded(trial.params[d.key], d) for d in spec.search.space}
        cell = trial_cell(spec, group, values)
        if cell.key in taken or cell.key in new:  # tried: told again, so the sampler moves on
            value = _metric(spec, taken[cell.key]) if cell.key in taken else None
            if value is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, value)
            continue
        new[cell.key] = cell  # left running in the study: the sampler avoids it (its liar)
    return list(new.values())


def group_name(group: SearchGroup) -> str:
    """'task / size / mechanism' and the other swept values of `group`."""
    parts = [group.base.task.label, group.base.size["label"], group.base.mechanism.label]
    return " / ".join([*parts, *(f"{k}={v}" for k, v in group.values.items())])


def run_search(
    spec: GridSpec, workers: int | None = None, retry_failed: bool = False, out=sys.stdout, **run
) -> dict[str, int]:
    """Run the search of `spec` (its [search]) until every group holds its `trials` trial
    cells: rounds of up to `workers` (default 1) new trials, each trained and stored by
    `run_grid` (`run`: its other arguments, e.g. executor, interval); stale trials (their run
    died) are trained again, failed ones with `retry_failed` (once). The counts of this run's
    outcomes by status."""
    if find_spec("optuna") is None:  # before any cell
        raise SpecError(f"{spec.path}: [search] needs optuna: pip install 'attn_zoo[search]'")
    plan = spec.search
    slots = workers or 1
    counts = dict.fromkeys(FINISHED, 0)
    for group in plan.groups:
        retried: set[str] = set()
        while True:
            trials = trials_of(spec, group, _stored_rows(spec))
            redo = []
            for cell, row in trials:
                stale = row["status"] == "running" and claim_is_stale(
                    row.get("owner"), row.get("heartbeat")
                )
                failed = retry_failed and row["status"] == "failed"
                if (stale or failed) and cell.key not in retried:
                    redo.append(cell)
            redo = redo[:slots]
            wanted = min(slots - len(redo), plan.table.trials - len(trials))
            cells = redo + (next_trials(spec, group, trials, wanted) if wanted > 0 else [])
            if not cells:
                if len(trials) < plan.table.trials:
                    print(
                        f"search {group_name(group)}: {len(trials)} of {plan.table.trials} "
                        f"trials; the sampler proposed only settings already tried "
                        f"{MAX_ASKS} times, so the group stops here",
                        file=out,
                    )
                break
            retried.update(cell.key for cell in redo)
            for i, cell in enumerate(cells):
                setting = ", ".join(f"{d.key}={cell.setting(d.key)}" for d in plan.space)
                which = "again" if cell in redo else f"{len(trials) + i + 1 - len(redo)}"
                print(f"search {group_name(group)}: trial {which} of {plan.table.trials}: "
                      f"{setting}", file=out, flush=True)  # fmt: skip
            done = run_grid(
                replace(spec, cells=cells, search=None), workers=min(slots, len(cells)),
                retry_failed=retry_failed, out=out, **run,
            )  # fmt: skip
            for status, n in done.items():
                counts[status] += n
    return counts


def trial_spec(spec: GridSpec) -> GridSpec:
    """`spec` with the trial cells its store holds as its cells (group by group, in the order
    they started), for status and reports; `spec` itself where it has no [search]."""
    if spec.search is None:
        return spec
    rows = _stored_rows(spec)
    cells = [cell for group in spec.search.groups for cell, _ in trials_of(spec, group, rows)]
    return replace(spec, cells=cells)


def _toml(value: object) -> str:
    return json.dumps(value)  # str, int, float and bool as TOML writes them


def _target(spec: GridSpec, group: SearchGroup, key: str) -> str:
    """The --set key that sets searched `key` for `group`'s mechanism (or task)."""
    section, _, name = key.partition(".")
    if section == "task_kwargs":
        tasks = [t.label for t in spec.file.tasks]
        return f"tasks[{tasks.index(group.base.task.label)}].kwargs.{name}"
    mechanisms = [m.label for m in spec.file.mechanisms]
    table = "kwargs" if section == "mechanism_kwargs" else section  # training, model
    return f"mechanisms[{mechanisms.index(group.base.mechanism.label)}].{table}.{name}"


def best_trials(spec: GridSpec) -> list[dict]:
    """Per group of the search: its name, the number of trials stored and done, and its best
    trial (`cell`, `value` of the metric; None where no trial is done with a finite metric)."""
    rows = _stored_rows(spec)
    sign = 1 if spec.search.direction == "maximize" else -1
    best = []
    for group in spec.search.groups:
        trials = trials_of(spec, group, rows)
        scored = [(_metric(spec, row), cell) for cell, row in trials]
        scored = [(value, cell) for value, cell in scored if value is not None]
        value, cell = max(scored, key=lambda pair: sign * pair[0], default=(None, None))
        best.append({"group": group, "trials": len(trials), "done": len(scored),
                     "cell": cell, "value": value})  # fmt: skip
    return best


def best_text(spec: GridSpec) -> str:
    """Each group's best trial, then the --set lines that put each mechanism (or task) at its
    best setting in a second-stage grid (the grid without [search], on every seed); a target
    whose best value differs between groups is a comment naming them instead."""
    plan = spec.search
    metric = plan.table.metric
    lines = [f"# search of grid {spec.name!r}: each group's best trial on {metric} "
             f"({plan.direction}d, seed {plan.seed})"]  # fmt: skip
    targets: dict[str, dict[str, list[str]]] = {}
    for found in best_trials(spec):
        group, cell = found["group"], found["cell"]
        tally = f"{found['trials']} trials, {found['done']} done"
        if cell is None:
            lines.append(f"# {group_name(group)}: no trial done yet ({tally})")
            continue
        setting = ", ".join(f"{d.key}={cell.setting(d.key)}" for d in plan.space)
        lines.append(f"# {group_name(group)}: {setting} ({metric} {found['value']:.4g}; {tally})")
        for d in plan.space:
            values = targets.setdefault(_target(spec, group, d.key), {})
            values.setdefault(_toml(cell.setting(d.key)), []).append(group_name(group))
    for target, values in targets.items():
        if len(values) == 1:
            lines.append(f"--set '{target}={next(iter(values))}'")
        else:
            chosen = "; ".join(f"{v} for {', '.join(g)}" for v, g in values.items())
            lines.append(f"# {target}: differs between groups ({chosen}): one grid per group")
    return "\n".join(lines)
