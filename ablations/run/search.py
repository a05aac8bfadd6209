"""Searching a grid's settings with Optuna instead of sweeping their product: a grid's
`[search]` (ablations.grid.schema.Search, checked by ablations.grid.spec.load_grid).

    [search]
    trials = 8                                  # settings tried per (task, size, mechanism)
    space."training.lr" = { low = 1e-4, high = 3e-2, log = true }
    metric = "val_acc"                          # or "val_loss" (minimized)
    pruner = "median"                           # or "successive_halving"; default "none"

    spec = load_grid("grid.toml")
    run_search(spec, workers=1)                 # `attn-zoo ablate run grid.toml`
    print(best_text(spec))                      # `attn-zoo ablate best grid.toml`

A search has groups: one per task, size, mechanism and values of the other swept keys
(`SearchPlan.groups`). Each trial of a group is a cell of the grid's store like any other
(ablations.grid.spec.trial_cell: the group's cell with the searched keys at the trial's values, on
the search's seed), keyed by its resolved config: a trial proposed again is the same cell and
is not trained again. So resume, concurrent runs, `ablate status`, reports and their
[selection] read a searched grid as they read a swept one (`trial_spec`).

The store is the search's only record. Before each round of a group, its Optuna study is
rebuilt from the group's finished trial cells (`trials_of`, `study_of`: each told in the order
they started, its stored curve reported as intermediate values, then completed with its
`metric`, pruned, or failed where it is not done or its metric is not finite) and the sampler
is seeded from the search's seed, the group and the number of trials stored: the next trials,
and with `workers=1` the pruner's decisions, are a function of the store alone, so an
interrupted search resumed proposes and prunes what an uninterrupted one would have. A round
asks for up to `workers` new settings (one by default, so that each trial is chosen knowing
every trial before it) and trains them; a group is done when it holds `trials` trial cells
(finished or training in another live run). Float values are rounded to 4 significant digits
(readable labels; a repeat is the same cell). The whole search runs on one executor
(ablations.run.runner.drive), after one smoke test per model of its groups at the searched keys'
first values (ablations.grid.spec.search_probe).

Pruning (`pruner`, local executor only): a trial's cell asks at each evaluation after which it
would train on whether to stop (its step and validation metric: trial.report, then
trial.should_prune on Optuna's MedianPruner or SuccessiveHalvingPruner); a pruned trial stops
there and is stored `pruned`, with its curve so far and `pruned_at`: a final outcome, never
trained again nor selected. A trial that fails (a searched value the model refuses, e.g.
n_heads that does not divide d_model) is stored `failed` with its error and told to Optuna as
failed; the search goes on.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from importlib.util import find_spec
from typing import TextIO

from ablations.grid.cell import Cell
from ablations.grid.search_space import Dimension, SearchGroup
from ablations.grid.spec import GridSpec, SpecError, search_probe, trial_cell
from ablations.grid.teacher import judged_from
from ablations.results.store import FINISHED, ResultsStore, claim_is_stale
from ablations.results.tracking import TrackingPlan, check_backends
from ablations.run.cell_worker import Evaluation
from ablations.run.runner import check_cells, drive

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


def _pruner(spec: GridSpec, group: SearchGroup):
    """The Optuna pruner of `group`'s study, as the search's [search] sets it."""
    import optuna

    plan, table = spec.search, spec.search.table
    if table.pruner == "median":
        after = table.prune_after_trials
        return optuna.pruners.MedianPruner(
            n_startup_trials=plan.startup_trials if after is None else after,
            n_warmup_steps=table.warmup_steps or 0,
        )
    if table.pruner == "successive_halving":
        first = trial_cell(spec, group, {}).training.eval_every
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=table.min_resource or first, reduction_factor=table.reduction_factor or 4
        )
    return optuna.pruners.NopPruner()


def _value(spec: GridSpec, val_loss: float, val_metric: float) -> float:
    """The search metric of an evaluation (a curve point's or a cell's question)."""
    return val_metric if spec.search.table.metric == "val_acc" else val_loss


def _tell(spec: GridSpec, study, trial, cell: Cell, row: dict) -> None:
    """Tell `study` that `trial` (asked at `cell`, a stored trial's setting) ended as `row`
    did: each point of its curve reported (the pruner asked at each point where the cell
    asked, so that successive halving keeps its rungs: not at its last, if done, nor before
    its last stage, `judged_from`), then completed with its metric, pruned, or failed (not
    done, or a metric that is not finite)."""
    import optuna

    curve = row.get("curve") or []
    asked = len(curve) - (row["status"] == "done")  # a done cell did not ask at its last
    first = judged_from(cell.size)
    for i, (step, _, val_loss, val_metric) in enumerate(curve):
        trial.report(_value(spec, val_loss, val_metric), step)
        if i < asked and step >= first:
            trial.should_prune()
    value = _metric(spec, row)
    if row["status"] == "pruned":
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    elif value is None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(trial, value)


def _asked_at(study, spec: GridSpec, cell: Cell):
    """A new trial of `study` at `cell`'s searched values (not sampled)."""
    study.enqueue_trial({d.key: cell.setting(d.key) for d in spec.search.space})
    return study.ask({d.key: _distribution(d) for d in spec.search.space})


def study_of(spec: GridSpec, group: SearchGroup, trials: list[tuple[Cell, dict]]):
    """The Optuna study of `group` rebuilt from its stored `trials` (`trials_of`): the finished
    ones told in the order they started (`_tell`), with the group's pruner (`_pruner`) and
    the sampler seeded by `_sampler_seed`."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    plan = spec.search
    finished = [(cell, row) for cell, row in trials if row["status"] in FINISHED]
    seed = _sampler_seed(spec, group, len(finished))
    if plan.table.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=plan.startup_trials)
    study = optuna.create_study(
        direction=plan.direction, sampler=sampler, pruner=_pruner(spec, group)
    )
    for cell, row in finished:
        _tell(spec, study, _asked_at(study, spec, cell), cell, row)
    return study


def next_trials(
    spec: GridSpec, study, trials: list[tuple[Cell, dict]], group: SearchGroup, count: int
) -> list[tuple[Cell, object]]:
    """Up to `count` new trial cells of `group` (none stored), each with its Optuna trial,
    asked of `study` (`study_of` its stored `trials`); fewer where the sampler keeps proposing
    settings already tried."""
    distributions = {d.key: _distribution(d) for d in spec.search.space}
    taken = {cell.key: row for cell, row in trials}
    new: dict[str, tuple[Cell, object]] = {}
    for _ in range(MAX_ASKS):
        if len(new) == count:
            break
        trial = study.ask(distributions)
        values = {d.key: _rounded(trial.params[d.key], d) for d in spec.search.space}
        cell = trial_cell(spec, group, values)
        if cell.key in taken or cell.key in new:  # tried: told again, so the sampler moves on
            _tell(spec, study, trial, cell, taken.get(cell.key, {"status": "running"}))
            continue
        new[cell.key] = (cell, trial)  # left running in the study until the cell ends
    return list(new.values())


def group_name(group: SearchGroup) -> str:
    """'task / size / mechanism' and the other swept values of `group`."""
    parts = [group.base.task.label, group.base.size["label"], group.base.mechanism.label]
    return " / ".join([*parts, *(f"{k}={v}" for k, v in group.values.items())])


class _Rounds:
    """A search's rounds as `drive` takes them: `feed` gives the next round's trial cells
    (group by group), `judge` answers their questions with each one's Optuna trial
    (trial.report, trial.should_prune)."""

    def __init__(self, spec: GridSpec, slots: int, retry_failed: bool):
        self.spec, self.slots, self.retry_failed = spec, slots, retry_failed
        self.groups = list(spec.search.groups)
        self.retried: set[str] = set()  # of the group in hand: trained again once at most
        self.live: dict[str, object] = {}  # cell key -> its trial, this round

    def feed(self, say) -> list[Cell]:
        """The next round's cells (none once every group holds its trials), its lines said."""
        while self.groups:
            cells = self._round(self.groups[0], say)
            if cells:
                return cells
            self.groups.pop(0)
            self.retried = set()
        return []

    def _round(self, group: SearchGroup, say) -> list[Cell]:
        """Up to `slots` cells of `group`: its stale trials (their run died) and, with
        `retry_failed`, its failed ones, each once, then new trials while it holds fewer than
        `trials`."""
        plan = self.spec.search
        trials = trials_of(self.spec, group, _stored_rows(self.spec))
        redo = []
        for cell, row in trials:
            stale = row["status"] == "running" and claim_is_stale(
                row.get("owner"), row.get("heartbeat")
            )
            failed = self.retry_failed and row["status"] == "failed"
            if (stale or failed) and cell.key not in self.retried:
                redo.append(cell)
        redo = redo[: self.slots]
        wanted = min(self.slots - len(redo), plan.table.trials - len(trials))
        study = study_of(self.spec, group, trials)
        chosen = [(cell, _asked_at(study, self.spec, cell)) for cell in redo]
        if wanted > 0:
            chosen += next_trials(self.spec, study, trials, group, wanted)
        if not chosen and len(trials) < plan.table.trials:
            say(f"search {group_name(group)}: {len(trials)} of {plan.table.trials} trials; the "
                f"sampler proposed only settings already tried {MAX_ASKS} times, so the group "
                "stops here")  # fmt: skip
        self.retried.update(cell.key for cell in redo)
        self.live = {cell.key: trial for cell, trial in chosen}
        for i, (cell, _) in enumerate(chosen):
            setting = ", ".join(f"{d.key}={cell.setting(d.key)}" for d in plan.space)
            which = "again" if cell in redo else f"{len(trials) + i + 1 - len(redo)}"
            say(f"search {group_name(group)}: trial {which} of {plan.table.trials}: {setting}")
        return [cell for cell, _ in chosen]

    def judge(self, question: Evaluation) -> bool:
        """Whether the trial of the cell asking (`question`) is pruned at its evaluation."""
        trial = self.live[question.key]
        trial.report(_value(self.spec, question.val_loss, question.val_metric), question.step)
        return trial.should_prune()


def run_search(
    spec: GridSpec,
    workers: int | None = None,
    retry_failed: bool = False,
    out: TextIO | None = None,
    executor: str = "local",
    address: str | None = None,
    interval: float = 10.0,
    tracking: TrackingPlan | None = None,
) -> dict[str, int]:
    """Run the search of `spec` (its [search]) until every group holds its `trials` trial
    cells: rounds of up to `workers` (default 1) new trials on one executor for the whole
    search (ablations.run.runner.drive; `executor`, `address`, `interval`, `tracking` as for
    ablations.run.runner.run_grid), after one smoke test per model of its groups; stale trials
    (their run died) are trained again, failed ones with `retry_failed` (once). A trial that
    fails (a searched value the model refuses) is stored failed and the search goes on; with a
    pruner, a trial stopped at an evaluation is stored pruned. The counts of this run's
    outcomes by status (with pruned where the search prunes)."""
    if find_spec("optuna") is None:  # before any cell
        raise SpecError(f"{spec.path}: [search] needs optuna: pip install 'attn_zoo[search]'")
    plan = spec.search
    if plan.table.pruner != "none" and executor != "local":
        raise SpecError(
            f"{spec.path}: search.pruner = {plan.table.pruner!r} needs executor 'local' (a "
            f"cell on {executor!r} cannot wait at an evaluation for the pruner's answer)"
        )
    tracking = spec.tracking if tracking is None else tracking
    check_backends(tracking)  # a missing package: TrackingError before anything runs
    probes = [trial_cell(spec, group, search_probe(plan)) for group in plan.groups]
    check_cells(replace(spec, cells=probes))  # one smoke test per model, not per round
    ResultsStore(spec.store).close()  # created first: another run may be creating it now
    rows = _stored_rows(spec)
    stored = [row for group in plan.groups for _, row in trials_of(spec, group, rows)]
    finished = sum(row["status"] in FINISHED for row in stored)
    slots = workers or 1
    rounds = _Rounds(spec, slots, retry_failed)
    judge = rounds.judge if plan.table.pruner != "none" else None
    return drive(
        replace(spec, search=None), rounds.feed, probes, finished, interval, out, tracking,
        executor=executor, workers=slots, address=address, retry_failed=retry_failed,
        judge=judge,
    )  # fmt: skip


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
    """Per group of the search: its name, the number of trials stored, done and pruned, and its
    best trial (`cell`, `value` of the metric; None where no trial is done with a finite
    metric)."""
    rows = _stored_rows(spec)
    sign = 1 if spec.search.direction == "maximize" else -1
    best = []
    for group in spec.search.groups:
        trials = trials_of(spec, group, rows)
        scored = [(_metric(spec, row), cell) for cell, row in trials]
        scored = [(value, cell) for value, cell in scored if value is not None]
        value, cell = max(scored, key=lambda pair: sign * pair[0], default=(None, None))
        pruned = sum(row["status"] == "pruned" for _, row in trials)
        best.append({"group": group, "trials": len(trials), "done": len(scored),
                     "pruned": pruned, "cell": cell, "value": value})  # fmt: skip
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
        tally += f", {found['pruned']} pruned" if found["pruned"] else ""
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
