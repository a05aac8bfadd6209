"""A report's tables: one tidy row per cell, the summary per task, size, mechanism and setting,
each task's table with its best values bold, the training-set size table, and cells.csv."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from ablations.grid.schema import higher_is_better
from ablations.report.pages import Table
from ablations.report.selection import (
    GROUP,
    UNFINISHED,
    interval,
    setting_text,
    varying_per_task,
    varying_settings,
)
from ablations.results.frames import keep_whole_numbers
from ablations.results.store import error_summary

FIELDS = {  # tidy column of a cell: its column in the store's frame (ResultsStore.to_dataframe)
    "key": "key",
    "task": "task",
    "size": "size",
    "mechanism": "mechanism",
    "seed": "seed",
    "status": "status",
    "n_train": "task_kwargs.n_train",
    "batch_size": "training.batch_size",
    "early_stop_target": "training.early_stop_target",
    "test_acc": "metrics.test_acc",
    "test_loss": "metrics.test_loss",
    "test_exact": "metrics.test_exact",
    "val_acc": "metrics.val_acc",
    "val_loss": "metrics.val_loss",
    "params": "metrics.params",
    "step_ms": "metrics.step_ms",
    "diverged_at": "metrics.diverged_at",
    "pruned_at": "metrics.pruned_at",
    "loss_floor_validation": "metrics.loss_floor_validation",
    "loss_floor_test": "metrics.loss_floor_test",
    "error": "error",
}


SUMMARY_COLUMNS = [
    "task",
    "size",
    "mechanism",
    "setting",
    "cells",
    "seeds",
    "test_acc_mean",
    "test_acc_std",
    "test_acc_low",
    "test_acc_high",
    "target",
    "reached",
    "steps_to_target",
    "samples_to_target",
    "params",
    "step_ms",
    "contended",
    "why",
]


SPLIT_SIZES = ("n_train", "n_validation", "n_test")


def contended(environment: Mapping | None) -> bool:
    """Whether a cell was timed while other cells competed for its cores: its run had more
    local workers x torch threads than CPUs (its `environment`'s workers, threads and cpus;
    False where they are not recorded)."""
    env = environment or {}
    workers, threads, cpus = (env.get(k) for k in ("workers", "threads", "cpus"))
    return None not in (workers, threads, cpus) and workers * threads > cpus


def tidy_cells(
    df: pd.DataFrame,
    swept: list[str] | None = None,
    environments: list[Mapping | None] | None = None,
) -> pd.DataFrame:
    """One tidy row per cell (the index of `df`, a `ResultsStore.to_dataframe()`): key, labels,
    status (a done cell with a NaN or infinite metric, named in the `non_finite` column of `df`
    that `non_finite_metrics` gives, counts as diverged), the numbers the report uses, the settings
    the cells vary in beyond task, size, mechanism and seed
    (ablations.report.selection.varying_settings: one column each, named as swept, e.g.
    "training.lr"; the grid's `swept` keys first, in their order, where its run recorded them:
    ablations/results/axes.py) and `setting`, their values as one text ('' where none varies);
    `contended` from the cells' `environments` (`ResultsStore.rows()`' "environment", in the
    order of `df`; None: not recorded, none contended). `axis_columns` names the settings."""
    missing = pd.Series(float("nan"), index=df.index)
    cells = {column: df.get(field, missing) for column, field in FIELDS.items()}
    cells.update({  # the metrics of a task's other test splits: test_ood_acc, ...
        column.removeprefix("metrics."): df[column]
        for column in df.columns
        if column.startswith("metrics.test_") and column.removeprefix("metrics.") not in cells
    })  # fmt: skip
    cells["non_finite"] = df.get("non_finite", pd.Series("", index=df.index)).fillna("")
    cells["contended"] = [contended(env) for env in environments or [None] * len(df)]
    settings = varying_settings(df)
    if swept is not None:
        first = [key for key in swept if key in settings.columns]
        settings = settings[first + [key for key in settings.columns if key not in first]]
    cells = pd.concat([pd.DataFrame(cells, index=df.index), settings], axis=1)
    cells["status"] = cells.status.mask((cells.status == "done") & (cells.non_finite != ""),
                                        "diverged")  # fmt: skip
    varying = varying_per_task(cells, list(settings.columns))
    cells["setting"] = [
        setting_text(row, varying[task])
        for task, (_, row) in zip(cells.task, settings.iterrows(), strict=True)
    ] or ""
    return cells


def task_family(config: Mapping) -> str:
    """The registered task of a cell's config with its kwargs other than split sizes:
    'name (k=v, ...)'."""
    kwargs = config.get("task_kwargs") or {}
    other = [f"{k}={v}" for k, v in sorted(kwargs.items()) if k not in SPLIT_SIZES]
    name = config.get("task_name")
    return f"{name} ({', '.join(other)})" if other else str(name)


def summary_table(
    cells: pd.DataFrame, curves: pd.DataFrame | None, target: float | None = None
) -> pd.DataFrame:
    """The main table from the tidy `cells` (`tidy_cells`) and `ResultsStore.curves()` (None: no
    curves, e.g. a report rebuilt from a cells.csv alone: no steps to target): per task,
    size, mechanism and setting (of the axes the cells vary in, e.g. "training.lr=0.001"; ''
    without), over the seeds that finished (`seeds`, of `cells` in all), test accuracy
    mean, std and 95% confidence interval (`test_acc_low`, `test_acc_high`: Student's t,
    ablations.report.selection.interval; NaN below 2 seeds); the target validation accuracy
    (`target`, else the cells' nonzero training.early_stop_target, else none), how many seeds
    `reached` it and their mean steps and samples (steps x batch size) to first reach it; mean
    parameters and ms per step; `why` a value is missing (e.g. "no seed finished: 1 diverged
    (at step 5), 2 failed"; '' where none is). Rows follow the order the cells started in."""
    rows = []
    for (task, size, mechanism, setting), group in cells.groupby(
        [*GROUP, "setting"], sort=False, dropna=False
    ):
        done = group[group.status == "done"]
        goal = target if target is not None else group.early_stop_target.iloc[0]
        goal = goal if goal and pd.notna(goal) else float("nan")
        steps, samples = [], []
        if pd.notna(goal) and curves is not None:  # per seed, the first evaluated step whose
            # validation accuracy reaches it
            reached = curves[curves.key.isin(done.key) & (curves.val_metric >= goal)]
            first = reached.groupby("key").step.min()
            for key, batch_size in zip(done.key, done.batch_size, strict=True):
                if key in first:
                    steps.append(first[key])
                    samples.append(first[key] * batch_size)
        mean, low, high, _ = interval(done.test_acc)
        why = []
        if done.empty:
            why.append(f"no seed finished: {_outcomes(group)}")
        else:
            if pd.notna(goal) and curves is None:
                why.append(f"steps to val acc ≥ {goal:g}: no curves ({NO_CURVES})")
            elif pd.notna(goal) and not steps:
                why.append(f"no seed reached val acc ≥ {goal:g}")
            why += [f"{name} not recorded" for name in ("test_acc", "params", "step_ms")
                    if done[name].isna().all()]  # fmt: skip
        rows.append(
            {
                "task": task,
                "size": size,
                "mechanism": mechanism,
                "setting": setting,
                "cells": len(group),
                "seeds": len(done),
                "test_acc_mean": mean,
                "test_acc_std": done.test_acc.std(),
                "test_acc_low": low,
                "test_acc_high": high,
                "target": goal,
                "reached": math.nan if curves is None and pd.notna(goal) else len(steps),
                "steps_to_target": pd.Series(steps, dtype=float).mean(),
                "samples_to_target": pd.Series(samples, dtype=float).mean(),
                "params": done.params.mean(),
                "step_ms": done.step_ms.mean(),
                "contended": bool(done.contended.fillna(False).astype(bool).any()),
                "why": "; ".join(why),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _best(table: pd.DataFrame) -> pd.DataFrame:
    """A mask of `table`'s (summary rows') cells holding a best value: per metric column, the
    highest accuracy and fewest steps and samples among the rows whose every cell finished
    (done: as ablations.report.selection.select counts a setting eligible; a mechanism's one
    surviving seed of three is no best), the steps and samples among those where the most seeds
    reached the target; fewest parameters, and ms among the rows not timed contended; no other
    column."""
    best = pd.DataFrame(False, index=table.index, columns=table.columns)
    finished = table.seeds == table.cells
    for column, higher, among in (
        ("test_acc_mean", True, finished), ("params", False, None),
        ("step_ms", False, ~table.contended),
    ):  # fmt: skip
        values = table[column] if among is None else table[column].where(among)
        best[column] = values == (values.max() if higher else values.min())
    share = (table.reached / table.seeds).where(finished)
    most = (share == share.max()) & (share > 0)
    for column in ("steps_to_target", "samples_to_target"):
        values = table[column].where(most)
        best[column] = values == values.min()
    return best


def _whole(value: float) -> str:
    """'1,920'; '-' for NaN."""
    return "-" if pd.isna(value) else f"{value:,.0f}"


def interval_text(
    mean: float, low: float, high: float, n: int | None = None, signed: bool = False
) -> str:
    """'0.912 [0.880, 0.944] (n=3)' ('+0.031 [-0.002, +0.064] (n=3)' `signed`; without
    '(n=...)' for no `n`); no interval where there is none (n < 2); '-' without a mean."""
    if pd.isna(mean):
        return "-"
    form = "+.3f" if signed else ".3f"
    count = "" if n is None else f" (n={n})"
    if pd.isna(low):
        return f"{mean:{form}}{count}"
    return f"{mean:{form}} [{low:{form}}, {high:{form}}]{count}"


def task_table(table: pd.DataFrame) -> Table:
    """One task's summary rows as a report table: each cell's text, its best values bold."""
    target = table.target.dropna()
    texts = {
        "size": table["size"].astype(str),
        "mechanism": table.mechanism.astype(str),
        **({"setting": table.setting.astype(str)} if table.setting.astype(bool).any() else {}),
        "seeds": [
            f"{seeds}" if seeds == cells else f"{seeds} of {cells}"
            for seeds, cells in zip(table.seeds, table.cells, strict=True)
        ],
        "test_acc_mean": [
            interval_text(mean, low, high)
            for mean, low, high in zip(
                table.test_acc_mean, table.test_acc_low, table.test_acc_high, strict=True
            )
        ],
    }
    headers = dict(size="size", mechanism="mechanism", setting="setting", seeds="seeds",
                   test_acc_mean="test acc [95% CI]")  # fmt: skip
    if len(target):
        reached = [
            "" if pd.isna(r) else f" ({r:.0f}/{s})"
            for r, s in zip(table.reached, table.seeds, strict=True)
        ]
        for column in ("steps_to_target", "samples_to_target"):
            texts[column] = table[column].map(_whole) + reached
        headers["steps_to_target"] = f"steps to val acc ≥ {target.iloc[0]:g}"
        headers["samples_to_target"] = "samples to target"
    texts["params"] = table.params.map(_whole)
    texts["step_ms"] = [
        "-" if pd.isna(ms) else f"{ms:.1f}" + (" (contended)" if busy else "")
        for ms, busy in zip(table.step_ms, table.contended, strict=True)
    ]
    headers |= {"params": "params", "step_ms": "ms/step"}
    if table.why.astype(bool).any():  # a '-' says why
        texts["why"] = table.why
        headers["why"] = "why -"
    data = pd.DataFrame(texts, index=table.index)
    return Table(data.rename(columns=headers), _best(table)[list(texts)].rename(columns=headers))


def _outcomes(cells: pd.DataFrame) -> str:
    """How the cells of `cells` that are not done ended: '2 diverged (at steps 5, 7), 1 failed'."""
    parts = []
    for status, group in cells[cells.status != "done"].groupby("status", sort=False):
        text = f"{len(group)} {UNFINISHED.get(status, status)}"
        at = {"diverged": group.diverged_at, "pruned": group.pruned_at}.get(status)
        steps = [] if at is None else [f"{step:.0f}" for step in at.dropna()]
        if steps:
            text += f" (at step{'s' * (len(steps) > 1)} {', '.join(steps)})"
        parts.append(text)
    return ", ".join(parts) or "no cell"


def with_cells_not_run(rows: list[dict], keys: set[str] | Mapping[str, dict]) -> list[dict]:
    """`rows` (`ResultsStore.rows()`) and, when `keys` maps each cell of a grid to its config, a
    "todo" row for every cell the store does not hold: counted, listed, and never taken for a
    finished seed."""
    if not isinstance(keys, Mapping):
        return rows
    held = {row["key"] for row in rows}
    todo = [{"key": k, "status": "todo", "config": c} for k, c in keys.items() if k not in held]
    return rows + todo


def cell_detail(cell: pd.Series) -> str:
    """Why a cell is not in the tables: the traceback's last line, or its divergence step."""
    if cell.status == "failed":
        return error_summary(cell.error)
    if cell.status == "diverged" and cell.non_finite:
        return f"stored done with a non-finite {cell.non_finite}: counted as diverged"
    if cell.status == "diverged":
        step = cell.diverged_at
        return "loss diverged" if pd.isna(step) else f"loss diverged at step {step:.0f}"
    if cell.status == "pruned":
        return f"pruned at step {cell.pruned_at:.0f} by the search's pruner (a final outcome)"
    if cell.status == "todo":
        return "not run: a cell of the grid that the store does not hold"
    return "unfinished: still running, or its run was interrupted"


def train_size_table(
    done: pd.DataFrame, metric: str = "test_acc", planned: pd.Series | None = None
) -> Table:
    """Rows n_train (and size), columns mechanism: `metric` as mean [95% CI] (n seeds), '-'
    where a mechanism has no cell; `planned`: the cells each (n_train, size, mechanism) has in
    all (None: every one is in `done`), a shortfall shown as '(n=1 of 3)'; bold: the best mean
    of the row among the mechanisms whose every planned cell finished (a mechanism's one
    surviving seed of three is no best)."""
    keys = ["n_train", "size", "mechanism"]
    stats = done.groupby(keys, sort=False)[metric].apply(
        lambda values: pd.Series(interval(values), index=["mean", "low", "high", "n"])
    ).unstack()  # fmt: skip
    planned = stats["n"] if planned is None else planned.reindex(stats.index)
    texts = [
        interval_text(m, lo, hi) + (f" (n={n:.0f})" if n >= p else f" (n={n:.0f} of {p:.0f})")
        for (m, lo, hi, n), p in zip(stats.to_numpy(), planned, strict=True)
    ]
    mechanisms = list(dict.fromkeys(done.mechanism))

    def by_mechanism(values: pd.Series, missing: object) -> pd.DataFrame:
        wide = values.unstack("mechanism").reindex(columns=mechanisms).sort_index()
        return wide.fillna(missing).set_axis([str(m) for m in mechanisms], axis=1)

    sign = 1 if higher_is_better(metric) else -1
    complete = stats["n"] >= planned
    means = by_mechanism((sign * stats["mean"].astype(float)).where(complete), float("nan"))
    bold = means.eq(means.max(axis=1), axis=0)
    n_train, size = (means.index.get_level_values(level) for level in (0, 1))
    rows = pd.DataFrame(
        {"n_train": [f"{n:.0f}" for n in n_train], "size": size.astype(str)}, index=means.index
    )
    data = pd.concat([rows, by_mechanism(pd.Series(texts, index=stats.index), "-")], axis=1)
    bold = pd.concat([rows != rows, bold], axis=1)
    return Table(data.reset_index(drop=True), bold.reset_index(drop=True))


def cells_csv(frame: pd.DataFrame, records: list[dict]) -> pd.DataFrame:
    """One row per cell of `frame` (`ResultsStore.to_dataframe()`'s, with `non_finite`) and
    `records` (their `ResultsStore.rows()`): key, status, its config columns ("training.lr",
    ...) sorted, its metrics ("metrics.test_acc", ...) sorted, the environment it ran in
    ("environment.torch", ...) sorted, then non_finite (the metrics of a done cell stored NaN
    or infinite: a CSV cell cannot tell NaN from missing), error and times: what
    ablations.results.cells_file reads back. Whole-number metrics stay whole beside a cell without
    them ("metrics.steps" 4, not 4.0, beside a cell not run)."""
    frame = frame.copy()
    metrics = [c for c in frame if c.startswith("metrics.")]
    keep_whole_numbers(frame, {
        column: [(r.get("metrics") or {}).get(column.removeprefix("metrics.")) for r in records]
        for column in metrics
    })  # fmt: skip
    environment = pd.DataFrame(
        [{f"environment.{k}": v for k, v in (r.get("environment") or {}).items()} for r in records],
        index=frame.index,
        dtype=object,  # threads 1 stays 1 beside a cell without an environment (not 1.0)
    )
    frame = pd.concat([frame, environment.reindex(columns=sorted(environment.columns))], axis=1)
    first = [c for c in ("key", "status") if c in frame]
    last = [c for c in ("non_finite", "error", "started", "finished") if c in frame]
    middle = [c for c in frame if c not in first + last]
    middle.sort(key=lambda c: (c.startswith("metrics."), c.startswith("environment."), c))
    return frame[first + middle + last]


NO_CURVES = "the report was rebuilt from a cells.csv without a curves.csv beside it"
