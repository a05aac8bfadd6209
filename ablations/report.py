"""Reports of a grid's results store: tables, plots, markdown and a self-contained HTML page.

`write_report(store, out_dir)` writes, under stable names:

    report.md            markdown for a code host: tables, links to the PNGs beside it
    index.html           one self-contained page: the same, PNGs embedded as base64 data URIs
    summary.csv          the main table, one row per (task, size, mechanism)
    cells.csv            one row per cell, config, metrics and environment flattened to dotted
                         columns (ablations.cells_file reads it back: a report rebuilt from it)
    curves.csv           the learning curves: key, step, train_loss, val_loss, val_metric
    provenance.json      the source (store or cells.csv), the grid file and its SHA-256, its
                         --set overrides, the environments the cells ran in, the date
    selection.csv, paired.csv  with a grid's [selection]: each mechanism at its best setting,
                         the paired differences with p-values, Holm-adjusted, and verdicts
    curves_<task>.png    validation accuracy vs step, per mechanism (and size, and setting):
                         mean, min-max band
    loss_curves_<task>.png  validation loss vs step, for sequence tasks (language model, seq2seq),
                         with the lowest loss possible where the task knows it (grammar)
    above_floor_<task>.png  validation loss minus that floor vs step, log scale (grammar)
    vs_params_<task>.png test accuracy vs parameters, one point per mechanism, size and setting
    vs_train_size_<family>.png  test accuracy vs n_train, where a task family's n_train varies
    attention_<cell>.png attention maps recorded when each cell finished, in grids that keep
                         checkpoints (ablations.attention_figures; writing a report runs no model)

(with a grid's [selection]: the curves and vs_params plots draw each mechanism's selected
setting only, the curves one plot per setting of the axes not chosen over, named
"<task>; <axes>"; the tables keep every setting), where <task>, <family> and <cell> are
`label_file_name`'s slug and hash of the label (e.g. ``curves_pairs-v64_3fa2c1d0.png``): two
labels never share a file, and no label can name a file outside the folder. Labels and notes
are shown as text on both pages (see ablations.report_pages); a missing or unreadable maps file
leaves its attention map out with a note. The folder is written whole or not at all: see
`write_report`.

Both pages are rendered from one page model through report_pages' markdown and HTML templates:
`report_page` writes the CSVs and PNGs and returns it (a report_pages.Page; each table a
DataFrame of the cells' texts and a boolean DataFrame of the best values, shown in bold).

A task is grouped by its label (`config["task"]`). A task family is a registered task with its
kwargs other than the split sizes (e.g. ``relational_games (problem=same)``): the training-set
size plots and table put the labels of one family side by side by `task_kwargs["n_train"]`.
Failed, diverged and unfinished cells are listed in their own section, never dropped.
"""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ablations.attention_figures import attention_blocks
from ablations.cells_file import ATTENTION_FILE, CellsFile, lacks_environment
from ablations.provenance import file_sha256
from ablations.report_pages import (
    TITLE_LABEL,
    Bullets,
    Image,
    Page,
    Paragraph,
    Section,
    Table,
    generated_now,
    label_colours,
    label_file_name,
    legend,
    new_figure,
    path_in,
    plot_text,
    plot_title,
    short_label,
    write_csv,
    write_pages,
)
from ablations.schema import Selection
from ablations.selection import (
    GROUP,
    UNFINISHED,
    differing_settings,
    higher_is_better,
    interval,
    paired,
    select,
    setting_text,
    varying_per_task,
    varying_settings,
    verdicts,
)
from ablations.steps import Steps
from ablations.store import (
    ResultsStore,
    _pid_alive,
    cells_table,
    error_summary,
    keep_whole_numbers,
)
from ablations.tasks import build_task
from ablations.tasks.registry import TASKS

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
    "why",
]
PAIRED_CSV = ["task", "size", "others", "a", "b", "mean", "low", "high", "n", "p", "p_holm",
              "tost_p", "tost_p_holm", "verdict", "margin", "reported"]  # fmt: skip
SPLIT_SIZES = ("n_train", "n_validation", "n_test")
REPORT_SUFFIXES = (".md", ".html", ".csv", ".png", ".json")  # what a report folder may hold
LINESTYLES = ["-", "--", ":", "-."]
N_TRAIN_AXES = ("task_kwargs.n_train", "training.steps")  # what a training-set size varies
MARKERS = ["o", "s", "^", "D", "v"]


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
    "error": "error",
}


def _cells(df: pd.DataFrame) -> pd.DataFrame:
    """One tidy row per cell (the index of `df`, a `ResultsStore.to_dataframe()`): key, labels,
    status (a done cell with a NaN or infinite metric, named in the `non_finite` column of `df`
    that `_non_finite` gives, counts as diverged), the numbers the report uses, the settings
    the cells vary in beyond task, size, mechanism and seed
    (ablations.selection.varying_settings: one column each, named as swept, e.g.
    "training.lr") and `setting`, their values as one text ('' where none varies)."""
    missing = pd.Series(float("nan"), index=df.index)
    cells = {column: df.get(field, missing) for column, field in FIELDS.items()}
    cells.update({  # the metrics of a task's other test splits: test_ood_acc, ...
        column.removeprefix("metrics."): df[column]
        for column in df.columns
        if column.startswith("metrics.test_") and column.removeprefix("metrics.") not in cells
    })  # fmt: skip
    cells["non_finite"] = df.get("non_finite", pd.Series("", index=df.index)).fillna("")
    settings = varying_settings(df)
    cells = pd.concat([pd.DataFrame(cells, index=df.index), settings], axis=1)
    cells["status"] = cells.status.mask((cells.status == "done") & (cells.non_finite != ""),
                                        "diverged")  # fmt: skip
    varying = varying_per_task(cells, list(settings.columns))
    cells["setting"] = [
        setting_text(row, varying[task])
        for task, (_, row) in zip(cells.task, settings.iterrows(), strict=True)
    ] or ""
    return cells


def _family(config: Mapping) -> str:
    """The registered task of a cell's config with its kwargs other than split sizes:
    'name (k=v, ...)'."""
    kwargs = config.get("task_kwargs") or {}
    other = [f"{k}={v}" for k, v in sorted(kwargs.items()) if k not in SPLIT_SIZES]
    name = config.get("task_name")
    return f"{name} ({', '.join(other)})" if other else str(name)


def summary_table(
    df: pd.DataFrame, curves: pd.DataFrame | None, target: float | None = None
) -> pd.DataFrame:
    """The main table from `ResultsStore.to_dataframe()` and `ResultsStore.curves()` (None: no
    curves, e.g. a report rebuilt from a cells.csv alone: no steps to target): per task,
    size, mechanism and setting (of the axes the cells vary in, e.g. "training.lr=0.001"; ''
    without), over the seeds that finished (`seeds`, of `cells` in all), test accuracy
    mean, std and 95% confidence interval (`test_acc_low`, `test_acc_high`: Student's t,
    ablations.selection.interval; NaN below 2 seeds); the target validation accuracy
    (`target`, else the cells' nonzero training.early_stop_target, else none), how many seeds
    `reached` it and their mean steps and samples (steps x batch size) to first reach it; mean
    parameters and ms per step; `why` a value is missing (e.g. "no seed finished: 1 diverged
    (at step 5), 2 failed"; '' where none is). Rows follow the order the cells started in."""
    cells = _cells(df)
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
                "why": "; ".join(why),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _best(table: pd.DataFrame) -> pd.DataFrame:
    """A mask of `table`'s (summary rows') cells holding a best value: per metric column, the
    highest accuracy; fewest steps and samples among the rows where the most seeds reached the
    target; fewest parameters and ms; no other column."""
    best = pd.DataFrame(False, index=table.index, columns=table.columns)
    for column, higher in (("test_acc_mean", True), ("params", False), ("step_ms", False)):
        values = table[column]
        best[column] = values == (values.max() if higher else values.min())
    share = table.reached / table.seeds
    most = (share == share.max()) & (share > 0)
    for column in ("steps_to_target", "samples_to_target"):
        values = table[column].where(most)
        best[column] = values == values.min()
    return best


def _whole(value: float) -> str:
    """'1,920'; '-' for NaN."""
    return "-" if pd.isna(value) else f"{value:,.0f}"


def _task_table(table: pd.DataFrame) -> Table:
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
            _interval_text(mean, low, high)
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
    texts["step_ms"] = table.step_ms.map(lambda ms: "-" if pd.isna(ms) else f"{ms:.1f}")
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


def _with_cells_not_run(rows: list[dict], keys: set[str] | Mapping[str, dict]) -> list[dict]:
    """`rows` (`ResultsStore.rows()`) and, when `keys` maps each cell of a grid to its config, a
    "todo" row for every cell the store does not hold: counted, listed, and never taken for a
    finished seed."""
    if not isinstance(keys, Mapping):
        return rows
    held = {row["key"] for row in rows}
    todo = [{"key": k, "status": "todo", "config": c} for k, c in keys.items() if k not in held]
    return rows + todo


def _detail(cell: pd.Series) -> str:
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


FIGURE_ALTS = {"curves": "learning curves", "loss_curves": "loss curves",
               "above_floor": "validation loss above the floor",
               "vs_params": "{metric} vs parameters"}  # fmt: skip
CURVE_COLUMNS = {"accuracy": "val_metric", "loss": "val_loss"}  # of ResultsStore.curves()


def _plot_curves(
    task: str,
    done: pd.DataFrame,
    curves: pd.DataFrame,
    colours: dict,
    metric: str = "accuracy",
    floor: float | None = None,
    above_floor: bool = False,
) -> Figure | None:
    """Validation `metric` ("accuracy" or "loss") vs step per mechanism (and size, and
    setting): mean line and min-max band over seeds; a seed that stopped early holds its last
    value; `floor`, the lowest validation loss possible (`_loss_floor`), a dotted black line,
    or with `above_floor` subtracted from every curve, drawn on a log scale (None where no
    mean is above it). `curves`: the store's `ResultsStore.curves()`, of these cells and
    others."""
    column = CURVE_COLUMNS[metric]
    shift, positive = (floor if above_floor else 0.0), False
    figure, ax = new_figure()
    sizes = list(dict.fromkeys(done["size"]))
    settings = list(dict.fromkeys(done["setting"]))
    for (size, mechanism, setting), group in done.groupby(
        ["size", "mechanism", "setting"], sort=False
    ):
        runs = curves[curves.key.isin(group.key)]
        if runs.empty:
            continue
        frame = runs.pivot(index="step", columns="key", values=column)  # a column per seed
        frame = frame[runs.key.unique()].sort_index().ffill() - shift  # in the cells' order
        positive |= bool((frame.mean(axis=1) > 0).any())
        label = plot_text(_curve_label(mechanism, size, setting, len(sizes) > 1))
        style = LINESTYLES[(sizes.index(size) + settings.index(setting)) % len(LINESTYLES)]
        colour = colours[mechanism]
        ax.plot(frame.index, frame.mean(axis=1), style, color=colour, label=label)
        ax.fill_between(frame.index, frame.min(axis=1), frame.max(axis=1), color=colour, alpha=0.2)
    if not ax.lines or (above_floor and not positive):  # nothing a log scale can show
        return None
    ylabel, what = f"validation {metric}", metric
    if above_floor:
        ax.set_yscale("log")
        ylabel, what = f"validation {metric} − floor ({floor:.3f})", f"{metric} above the floor"
    elif floor is not None:
        ax.axhline(floor, color="black", linestyle=":", label="floor (no model can be lower)")
    title = plot_title(f"{short_label(task, TITLE_LABEL)}: learning curves ({what})")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    legend(figure, ax)
    return figure


def _setting_columns(cells: pd.DataFrame) -> list[str]:
    """The axis columns of `cells` (`_cells`): named as swept, with a "."."""
    return [c for c in cells.columns if "." in c]


def _over(cells: pd.DataFrame, selection: Selection) -> list[str]:
    """The axis columns of `cells` that `selection` chooses a setting of: its `over`, or every
    axis where it names none."""
    columns = _setting_columns(cells)
    return [c for c in selection.over or columns if c in columns]


def _curve_panels(
    task: str, done: pd.DataFrame, selection: Selection | None
) -> list[tuple[str, pd.DataFrame]]:
    """The learning-curve plots of `task`'s cells `done`: one of them all, or with a
    selection, one per setting of the axes it does not choose over (e.g. n_train, pooling),
    each mechanism's curve labelled by its chosen setting only: ("<task>; <other axes>",
    its cells)."""
    if selection is None:
        return [(task, done)]
    over = _over(done, selection)
    varying = varying_per_task(done, _setting_columns(done)).get(task, [])
    others = [c for c in varying if c not in over]
    if not others:
        return [(task, done)]
    chosen = [c for c in over if c in varying]
    panels = []
    for _, group in done.groupby(others, sort=False, dropna=False):
        label = f"{task}; {setting_text(group.iloc[0], others)}"
        group = group.assign(setting=[setting_text(row, chosen) for _, row in group.iterrows()])
        panels.append((label, group))
    return panels


def _curve_label(mechanism: str, size: str, setting: str, sizes: bool) -> str:
    """'relational (small; training.lr=0.001)': the size where a plot has several, the
    setting where the cells have one; a mechanism or size label of over LABEL_CHARS
    characters shortened (report_pages.short_label)."""
    mechanism, size = short_label(mechanism), short_label(size)
    details = ([size] if sizes else []) + ([setting] if setting else [])
    return f"{mechanism} ({'; '.join(details)})" if details else mechanism


def _metric_name(metric: str) -> str:
    """How plots name a reported metric: 'accuracy' for test_acc, else 'test loss' etc."""
    return "accuracy" if metric == "test_acc" else metric.replace("_", " ")


def _loss_floor(configs: list[dict]) -> dict[str, float] | None:
    """The lowest mean loss any model can have on the validation and test splits of the done
    cells of one task (their `configs`), for a task that knows it (`best_losses`, e.g. the
    grammar task's true probabilities): the mean over the splits those cells used, one per seed
    and setting of the task's arguments. None for a task without one."""
    settings = {
        (config["task_name"], json.dumps(config["task_kwargs"]), int(config["seed"]))
        for config in configs
    }
    floors: dict[str, list[float]] = {"validation": [], "test": []}
    for name, kwargs, seed in sorted(settings):
        if not hasattr(TASKS[name], "best_losses"):  # built only then: no file of it is read
            return None
        task = build_task(name, **json.loads(kwargs))
        splits = task.splits(seed)
        for split, values in floors.items():
            values.append(float(task.best_losses(*splits[split][:]).mean()))
    if not settings:
        return None
    return {split: sum(values) / len(values) for split, values in floors.items()}


def _plot_vs_params(
    task: str, done: pd.DataFrame, colours: dict, metric: str = "test_acc"
) -> Figure | None:
    """`metric` vs parameters of the finished cells `done`: one point per mechanism, size and
    setting (the mean over seeds), error bars the 95% confidence interval over seeds."""
    if done.empty:
        return None
    figure, ax = new_figure()
    sizes = list(dict.fromkeys(done["size"]))
    for (size, mechanism, setting), group in done.groupby(
        ["size", "mechanism", "setting"], sort=False
    ):
        mean, _, high, _ = interval(group[metric])
        label = plot_text(_curve_label(mechanism, size, setting, len(sizes) > 1))
        ax.errorbar(
            group.params.mean(), mean, yerr=0.0 if pd.isna(high) else high - mean,
            fmt=MARKERS[sizes.index(size) % len(MARKERS)], capsize=3,
            color=colours[mechanism], label=label,
        )  # fmt: skip
    ax.set_xscale("log")
    name = _metric_name(metric)
    ax.set(xlabel="parameters", ylabel="test accuracy" if metric == "test_acc" else name)
    ax.set_title(plot_title(f"{short_label(task, TITLE_LABEL)}: {name} vs parameters"))
    legend(figure, ax)
    return figure


def _train_size_table(done: pd.DataFrame, metric: str = "test_acc") -> Table:
    """Rows n_train (and size), columns mechanism: `metric` as mean [95% CI] (n seeds), '-'
    where a mechanism has no cell; bold: the best mean of the row."""
    stats = done.groupby(["n_train", "size", "mechanism"], sort=False)[metric].apply(
        lambda values: pd.Series(interval(values), index=["mean", "low", "high", "n"])
    ).unstack()  # fmt: skip
    texts = [_interval_text(m, lo, hi, int(n)) for m, lo, hi, n in stats.to_numpy()]
    mechanisms = list(dict.fromkeys(done.mechanism))

    def by_mechanism(values: pd.Series, missing: object) -> pd.DataFrame:
        wide = values.unstack("mechanism").reindex(columns=mechanisms).sort_index()
        return wide.fillna(missing).set_axis([str(m) for m in mechanisms], axis=1)

    sign = 1 if higher_is_better(metric) else -1
    means = by_mechanism(sign * stats["mean"].astype(float), float("nan"))
    bold = means.eq(means.max(axis=1), axis=0)
    n_train, size = (means.index.get_level_values(level) for level in (0, 1))
    rows = pd.DataFrame(
        {"n_train": [f"{n:.0f}" for n in n_train], "size": size.astype(str)}, index=means.index
    )
    data = pd.concat([rows, by_mechanism(pd.Series(texts, index=stats.index), "-")], axis=1)
    bold = pd.concat([rows != rows, bold], axis=1)
    return Table(data.reset_index(drop=True), bold.reset_index(drop=True))


def _plot_vs_train_size(
    task_name: str, done: pd.DataFrame, colours: dict, metric: str = "test_acc"
) -> Figure:
    """`metric` (mean, error bars: 95% confidence interval over seeds) vs n_train, per
    mechanism and size."""
    figure, ax = new_figure()
    sizes = list(dict.fromkeys(done["size"]))
    for (size, mechanism), group in done.groupby(["size", "mechanism"], sort=False):
        stats = group.groupby("n_train")[metric].apply(
            lambda values: pd.Series(interval(values)[:3], index=["mean", "low", "high"])
        ).unstack()  # fmt: skip
        half = (stats["high"] - stats["mean"]).fillna(0.0)
        label = plot_text(_curve_label(mechanism, size, "", len(sizes) > 1))
        style = LINESTYLES[sizes.index(size) % len(LINESTYLES)]
        ax.errorbar(
            stats.index, stats["mean"], yerr=half, fmt="o" + style, capsize=3,
            color=colours[mechanism], label=label,
        )  # fmt: skip
    n_train = sorted(done.n_train.unique())
    ax.set_xscale("log")
    ax.set_xticks(n_train, labels=[f"{n:.0f}" for n in n_train])
    ax.minorticks_off()
    ax.set(xlabel="training examples (n_train)", ylabel=metric.replace("_", " "))
    ax.set_title(
        plot_title(f"{short_label(task_name, TITLE_LABEL)}: {metric} vs training-set size")
    )
    legend(figure, ax)
    return figure


def _environments(store: ResultsStore | CellsFile) -> list[str]:
    """The distinct (torch, machine, GPU, threads, commit) the cells ran with, as texts (the
    GPU's name where a cell trained on one); for the rows of a cells.csv without them, the
    line of the report.md beside it (`recorded_environment`), said to be theirs when other
    rows have their own."""
    seen, missing = [], 0
    for row in store.rows():
        env = dict(row["environment"] or {})
        if str(env.get("device", "cpu")).startswith("cuda") and env.get("device_name"):
            env["gpu"] = env["device_name"]
        keys = ("torch", "machine", "gpu", "threads", "commit")
        text = ", ".join(f"{k} {env[k]}" for k in keys if k in env)
        missing += lacks_environment(row)
        if text and text not in seen:
            seen.append(text)
    recorded = getattr(store, "recorded_environment", None)
    if missing and recorded:
        whose = f"for the {missing} cells without one in cells.csv: " if seen else ""
        seen.append(f"{whose}{recorded} (as the report.md beside {store.path} recorded it)")
    return seen


def _non_finite(store: ResultsStore | CellsFile) -> dict[str, str]:
    """Per key of a done cell with NaN or infinite metrics (a store written before training
    recorded such a cell as diverged), those metrics' names: 'val_loss, test_loss'."""
    found = {}
    for row in store.rows():
        metrics = row["metrics"] or {}
        names = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
        if row["status"] == "done" and names:
            found[row["key"]] = ", ".join(names)
    return found


def _cells_csv(frame: pd.DataFrame, records: list[dict]) -> pd.DataFrame:
    """One row per cell of `frame` (`ResultsStore.to_dataframe()`'s, with `non_finite`) and
    `records` (their `ResultsStore.rows()`): key, status, its config columns ("training.lr",
    ...) sorted, its metrics ("metrics.test_acc", ...) sorted, the environment it ran in
    ("environment.torch", ...) sorted, then non_finite (the metrics of a done cell stored NaN
    or infinite: a CSV cell cannot tell NaN from missing), error and times: what
    ablations.cells_file reads back. Whole-number metrics stay whole beside a cell without
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


INTRO = (
    "Test accuracy: mean [95% confidence interval] over the seeds that finished (Student's t, "
    "unclipped: with few seeds a bound can pass 1; seeds: finished, of all; no interval for "
    "one seed). "
    "Steps to target: the first evaluated step whose validation accuracy reaches the "
    "target, mean over the seeds that reached it (reached/finished); samples = steps × "
    "batch size. Bold: best in the task (highest accuracy; fewest steps and samples "
    "among the rows where most seeds reached the target; fewest parameters; lowest "
    "ms/step). Learning curves: mean line and min-max band over seeds (a seed that "
    "stopped early holds its last value). Data: summary.csv, cells.csv (every cell: "
    "config, metrics, environment) and curves.csv (every evaluated step); provenance.json: "
    "the source, the grid file's SHA-256 and the environments. `attn-zoo report "
    "<folder>/cells.csv --grid <grid> --out <folder>` rebuilds this report from them."
)
NO_CURVES = "the report was rebuilt from a cells.csv without a curves.csv beside it"


def _page(
    frame: pd.DataFrame,
    cells: pd.DataFrame,
    title: str | None,
    note: str | None,
    provenance: dict,
) -> Page:
    """The page without sections: title, facts (grid names and the report's source, the grid
    file and its SHA-256, cells by status, environment, date: `provenance`), how to read the
    tables, and the note."""
    grids = sorted(set(frame.get("grid", [])))
    counts = cells.status.value_counts()
    shown = ("done", "failed", "diverged", "running")  # pruned: a search's; todo: not run
    shown += tuple(s for s in ("pruned", "todo") if counts.get(s))
    statuses = ", ".join(f"{counts.get(s, 0)} {s}" for s in shown)
    source = provenance["source"]
    if source.endswith(".csv"):
        with_curves = " and the curves.csv beside it" if provenance["curves"] else ""
        maps = (" carried over from the report beside it" if provenance["attention_carried"]
                else ", whose files lie beside the store, are not redrawn")  # fmt: skip
        source = f"rebuilt from {source}{with_curves}; attention maps{maps}"
    else:
        source = f"store {source}"
    facts = [f"Grid: {', '.join(grids) or '-'} ({source})"]
    if provenance["grid_file"]:
        overrides = " ".join(f"--set {o}" for o in provenance["overrides"])
        facts.append(f"Grid file: {provenance['grid_file']}, SHA-256 {provenance['grid_sha256']}"
                     + (f", with {overrides}" if overrides else ""))  # fmt: skip
    facts += [
        f"Cells: {len(cells)} ({statuses})",
        f"Environment: {'; '.join(provenance['environment']) or 'not recorded'}",
        f"Generated: {provenance['generated']}",
    ]
    if not provenance["curves"]:
        facts.append(f"Learning curves and steps to target: left out ({NO_CURVES})")
    title = title or "Ablation report: " + (", ".join(grids) or "empty store")
    return Page(title, facts, INTRO, note or None)


def _provenance(
    store: ResultsStore | CellsFile,
    curves: pd.DataFrame | None,
    grid: str | Path | None,
    overrides: Sequence[str],
) -> dict:
    """What the report was built from, as provenance.json holds it: `source` (the store's or
    cells.csv's path), `curves` (whether it had learning curves), `attention_carried` (whether
    a cells.csv's report beside it gave it at least one attention map), `grid_file` and
    `grid_sha256` (the grid file's SHA-256; None without a grid), `overrides` (its --set
    values), `environment` (`_environments`) and `generated` (the date)."""
    digest = None if grid is None else file_sha256(grid)
    return {
        "source": str(store.path),
        "curves": curves is not None,
        "attention_carried": isinstance(store, CellsFile)
        and bool(store.attention and store.attention[1]),
        "grid_file": None if grid is None else str(grid),
        "grid_sha256": digest,
        "overrides": list(overrides),
        "environment": _environments(store),
        "generated": generated_now(),
    }


def write_report(
    store: str | Path | ResultsStore | CellsFile,
    out_dir: str | Path,
    title: str | None = None,
    target: float | None = None,
    note: str | None = None,
    selection: Selection | None = None,
    keys: set[str] | Mapping[str, dict] | None = None,
    progress: Steps | None = None,
    grid: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> Path:
    """Write the report of `store` (a ResultsStore or the path of its SQLite file; or a
    report's cells.csv, ablations.cells_file) into the folder `out_dir`: report.md,
    index.html, summary.csv, cells.csv, curves.csv, provenance.json and the PNG plots, with
    attention maps of the cells that kept checkpoints (and attention.json, their blocks).
    `grid` (the grid file's path, and its --set `overrides`) is named with its SHA-256 in the
    header and provenance.json. A report from a cells.csv draws no attention maps but carries
    over those of the report beside the cells.csv (its attention.json and PNG files), and
    without a curves.csv beside it has no learning curves and no steps to target (one line of
    the header says so). `target` is the validation accuracy for steps-to-target (default:
    the cells' training.early_stop_target when nonzero); `note` a paragraph shown under the
    header (e.g. the conclusion), the one text whose markdown report.md keeps (raw HTML in it
    is escaped, see ablations.report_pages); `selection` (a grid's [selection]) adds the
    section comparing each mechanism at its best setting (ablations.selection) and writes
    selection.csv and paired.csv; `keys` limits the report to those cells (a grid's: the store's
    other cells, e.g. of an earlier version of the grid, are left out and counted in the
    header); given as {key: config}, the grid's cells the store does not hold are counted and
    listed as not run, and no selection takes a setting that lacks one. `progress`
    (ablations.steps) counts the steps: the tables, each plot and attention map, and the pages.
    Returns `out_dir`.

    The folder belongs to the report and is written whole or not at all: the report is written
    into a new hidden sibling folder (``.<name>.partial-<pid>-<random>``), which then replaces
    `out_dir` (`_replace_folder`: swapped in one step where the file system can), so files in
    `out_dir` that this report does not write are deleted with the previous report, an error
    on the way leaves the previous report as it was and no partial folder behind, and a kill
    at any instant leaves the old or the new report; the next report into `out_dir` deletes
    what killed reports left (`_recover`).
    To keep other files safe, `out_dir` must be missing, empty, or a previous report: a folder
    of .md, .html, .csv, .png and .json files holding report.md (FileExistsError otherwise).
    A cells.csv inside `out_dir` is read whole before the folder is replaced."""
    store = _open(store)
    final = Path(out_dir).resolve()
    _recover(final)
    _check_replaceable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial_dir = _hidden(final, "partial")
    partial_dir.mkdir()
    try:
        progress = progress or Steps()
        progress.expect(1)  # the pages, after report_page's steps
        page = report_page(
            store, partial_dir, title, target, note, selection, keys, progress, grid, overrides
        )
        progress.doing("pages: report.md, index.html")
        write_pages(page, partial_dir)
        _replace_folder(partial_dir, final)
        progress.advance()
    finally:
        shutil.rmtree(partial_dir, ignore_errors=True)  # gone already unless something failed
    return Path(out_dir)


def _check_replaceable(folder: Path) -> None:
    """FileExistsError unless `folder` is missing, empty or a previous report (only top-level
    .md, .html, .csv, .png and .json files or links, report.md among them): replacing it
    deletes what it holds (a link itself, never what it points to)."""
    if folder.parent == folder:
        raise ValueError(f"{folder} cannot be a report folder: it has no parent")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder: the report cannot be written there")
    entries = list(folder.iterdir())
    other = sorted(
        p.name
        for p in entries
        if p.suffix not in REPORT_SUFFIXES or not (p.is_symlink() or p.is_file())
    )
    if entries and (other or not (folder / "report.md").is_file()):
        held = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "") or "no report.md"
        raise FileExistsError(
            f"{folder} is not empty and not a previous report ({held}); a report replaces its "
            "whole folder: write it to a new folder, or to an earlier report's"
        )


def _hidden(final: Path, kind: str) -> Path:
    """A new hidden sibling folder name of `final` for this process: `.<name>.<kind>-<pid>-<hex>`
    (`kind`: "partial", a report being written, or "old", the previous one set aside)."""
    return final.with_name(f".{final.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _recover(final: Path) -> None:
    """Clean up after reports into `final` that were killed: where `final` is missing but a dead
    run set the previous report aside (``.<name>.old-<pid>-*``), put it back; then delete the
    hidden folders of dead runs (of this host: the pid in the name). A live run's are kept."""
    pattern = re.compile(rf"\.{re.escape(final.name)}\.(partial|old)-(\d+)-[0-9a-f]{{8}}")
    dead = []
    for path in final.parent.iterdir() if final.parent.is_dir() else []:
        match = pattern.fullmatch(path.name)
        if match and path.is_dir() and not path.is_symlink() and not _pid_alive(int(match[2])):
            dead.append((match[1], path))
    olds = [path for kind, path in dead if kind == "old"]
    if olds and not (final.exists() or final.is_symlink()):
        max(olds, key=lambda path: path.stat().st_mtime_ns).rename(final)
    for _, path in dead:
        shutil.rmtree(path, ignore_errors=True)


RENAME_EXCHANGE = 2  # renameat2 flag: swap the two paths in one step (Linux 3.15)
AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swap the folders `first` and `second` in one step (Linux renameat2 RENAME_EXCHANGE), so
    that at every instant each path holds one of them: whether it was done (False where the
    system or the file system has no such call)."""
    if sys.platform != "linux":
        return False
    rename = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename is None:  # a C library older than glibc 2.28
        return False
    paths = (AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE)
    if rename(*paths) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def _replace_folder(new: Path, final: Path) -> None:
    """Put the complete folder `new` in the place of `final` so that a kill at any instant
    leaves a whole report there, the old or the new one: swap them in one step (`_exchange`)
    and delete the old one, now at `new`. Where the file system cannot swap: rename the old
    one aside (``.<name>.old-*``), rename `new` in (renaming the old one back on an error),
    delete the old one; a kill between the two renames leaves `final` missing until the next
    report puts the old one back (`_recover`)."""
    if not (final.exists() or final.is_symlink()):
        new.rename(final)
        return
    if _exchange(new, final):
        shutil.rmtree(new, ignore_errors=True)
        return
    old = _hidden(final, "old")
    final.rename(old)
    try:
        new.rename(final)
    except BaseException:
        old.rename(final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _new_file(folder: Path, name: str) -> Path:
    """The path of a new file `name` directly inside `folder` (see report_pages.path_in);
    FileExistsError if the report already wrote a file of that name."""
    path = path_in(folder, name)
    if path.exists():
        raise FileExistsError(f"two files of the report are named {name}: a name collision")
    return path


def _open(store: str | Path | ResultsStore | CellsFile) -> ResultsStore | CellsFile:
    """`store`, or the ResultsStore at that path opened read-only (a .csv path: its
    CellsFile): a report creates and changes nothing beside its folder (FileNotFoundError
    without a store, StoreError for a file that is not one)."""
    if isinstance(store, (ResultsStore, CellsFile)):
        return store
    if Path(store).suffix == ".csv":
        return CellsFile(store)
    if not Path(store).is_file():
        raise FileNotFoundError(f"no results store at {store}")
    return ResultsStore(store, readonly=True)


def report_page(
    store: str | Path | ResultsStore | CellsFile,
    folder: str | Path,
    title: str | None = None,
    target: float | None = None,
    note: str | None = None,
    selection: Selection | None = None,
    keys: set[str] | Mapping[str, dict] | None = None,
    progress: Steps | None = None,
    grid: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> Page:
    """Write the report's data and plots (summary.csv, cells.csv, curves.csv, provenance.json,
    the PNGs) into the empty `folder` and return its page (the model report.md and index.html
    are rendered from, see `report_pages.write_pages`); the arguments are `write_report`'s.
    The plots are planned first and drawn last, so that `progress` knows their number before
    the first is drawn."""
    store, folder = _open(store), Path(folder)
    records, left_out = list(store.rows()), 0
    if keys is not None:
        mine = [record for record in records if record["key"] in keys]
        left_out, records = len(records) - len(mine), _with_cells_not_run(mine, keys)
    configs = [record["config"] for record in records]  # as stored (the frame's are flat)
    frame, curves = cells_table(records), store.curves()
    non_finite = _non_finite(store)
    frame["non_finite"] = [non_finite.get(key, "") for key in frame.key]
    cells = _cells(frame).assign(family=[_family(config) for config in configs])
    summary = summary_table(frame, curves, target)

    progress = progress or Steps()
    progress.expect(1)  # the tables: cells, summary, and selection
    progress.doing("tables")
    write_csv(_cells_csv(frame, records), _new_file(folder, "cells.csv"))
    if curves is not None:  # the report's cells' only
        write_csv(curves[curves.key.isin(frame.key)], _new_file(folder, "curves.csv"))
    write_csv(summary, _new_file(folder, "summary.csv"))
    provenance = _provenance(store, curves, grid, overrides)
    text = json.dumps(provenance, indent=2, ensure_ascii=False) + "\n"
    _new_file(folder, "provenance.json").write_text(text, encoding="utf-8")
    page = _page(frame, cells, title, note, provenance)
    if left_out:
        page.facts.insert(2, f"Left out: {left_out} cells of the store that are not in the grid")

    differing = differing_settings(frame)  # e.g. a mechanism with its own learning rate
    colours = label_colours(cells.mechanism.dropna())
    done = cells[cells.status == "done"]
    chosen_keys = None  # the cells of each mechanism's selected setting: their maps are shown
    plots: list[tuple[Section, str, str, Callable[[], Figure | None]]] = []  # drawn below
    plotted, metric = done, "test_acc"  # the cells the task plots draw, the metric they show
    if selection is not None:
        section, rows = _selection_section(cells, selection, folder)
        section.parts[1:1] = [_differing(task, keys) for task, keys in differing.items()]
        page.sections.append(section)
        chosen_keys = set(frame.loc[sorted(rows), "key"])
        plotted, metric = done.loc[done.index.isin(rows)], selection.reported_metrics[0]
    for task, table in summary.groupby("task", sort=False):
        section = Section(f"Task: {task}", [_task_table(table.reset_index(drop=True))])
        if str(task) in differing:
            section.parts.append(_differing(str(task), differing[str(task)]))
        if selection is not None:
            section.parts.append(Paragraph(
                "The table: every setting. The plots: each mechanism at its selected "
                "setting (see Selection; not drawn where no setting finished on every seed)."
            ))  # fmt: skip
        figures, mine = [], plotted[plotted.task == task]  # (kind, label, draw): drawn below
        floor = _loss_floor([configs[i] for i in mine.index])
        if floor is not None:
            section.parts.append(Paragraph(
                f"Loss floor: no model can have a mean loss below {floor['test']:.3f} on these "
                f"test splits ({floor['validation']:.3f} on validation): the task's own "
                "probabilities give it (best_losses, mean over the seeds' splits)"
                + ("; the loss curves draw the validation floor, and a second plot each "
                   "curve's height above it on a log scale." if curves is not None else ".")
            ))  # fmt: skip
        val_floor = None if floor is None else floor["validation"]
        panels = [] if curves is None else _curve_panels(str(task), mine, selection)
        for label, panel in panels:
            figures.append(("curves", label, partial(_plot_curves, label, panel, curves, colours)))
            if panel.test_exact.notna().any():  # sequence tasks (scored per position)
                loss = partial(_plot_curves, label, panel, curves, colours, "loss", val_floor)
                figures.append(("loss_curves", label, loss))
                if val_floor is not None:
                    figures.append(("above_floor", label, partial(loss, above_floor=True)))
        vs_params = partial(_plot_vs_params, str(task), mine, colours, metric)
        figures.append(("vs_params", task, vs_params))
        for kind, label, draw in figures:
            alt = FIGURE_ALTS[kind].format(metric=_metric_name(metric))
            plots.append((section, label_file_name(kind, str(label)), f"{label}: {alt}", draw))
        page.sections.append(section)

    # one section per task family and setting of the axes other than n_train (and the steps
    # an epoch count resolves to); with a selection, each mechanism at its selected setting
    # (per n_train) and the first reported metric
    others = [c for c in _setting_columns(cells) if c not in N_TRAIN_AXES]
    described = "Test accuracy"
    if selection is not None:
        done = plotted
        over = _over(cells, selection)
        others = [c for c in others if c not in over]
        described = f"Each mechanism at its selected setting (see Selection): {metric}"
    varying = varying_per_task(done, others)
    done = done.assign(
        others=[setting_text(row, varying[row.task]) for _, row in done.iterrows()] or ""
    )
    with_n = done.dropna(subset=["n_train"])
    for (family, other), group in with_n.groupby(["family", "others"], sort=False):
        if group.n_train.nunique() > 1:
            heading = f"{family}; {other}" if other else family
            table = _train_size_table(group, metric)
            dash = (table.data == "-").to_numpy().any()
            parts = [
                Paragraph(
                    f"{described}, mean [95% CI] (seeds), error bars the same interval; bold: "
                    "the best mechanism per row."
                    + (
                        " -: no cell of that mechanism finished at that n_train (not run, or "
                        "see Cells not in the tables)."
                        if dash
                        else ""
                    )
                ),  # fmt: skip
                table,
            ]
            section = Section(f"Training-set size: {heading}", parts)
            plots.append((
                section,
                label_file_name("vs_train_size", str(heading)),
                f"{heading}: {metric} vs training-set size",
                partial(_plot_vs_train_size, heading, group, colours, metric),
            ))  # fmt: skip
            page.sections.append(section)

    progress.expect(len(plots))
    progress.advance()  # the tables
    for section, name, alt, draw in plots:  # one figure at a time in memory
        progress.doing(f"plot {name}")
        figure = draw()
        if figure is not None:
            figure.savefig(_new_file(folder, name), dpi=100)
            section.parts.append(Image(name, alt))
        progress.advance()

    if isinstance(store, ResultsStore):  # the maps files lie beside the store
        page.sections.extend(_attention_sections(store, folder, keys, chosen_keys, progress))
    elif store.attention is not None:  # a cells.csv: the maps of the report beside it
        page.sections.extend(_carried_attention_sections(store.attention, folder))
    unfinished = cells[cells.status != "done"]
    if unfinished.empty:
        part = Paragraph("None: every cell finished.")
    else:
        columns = ["task", "size", "mechanism", "setting", "seed", "status"]
        if not unfinished.setting.astype(bool).any():  # no setting varies here: no column
            columns.remove("setting")
        data = unfinished[columns].astype(str)
        part = Table(data.assign(detail=unfinished.apply(_detail, axis=1)))
    page.sections.append(Section("Cells not in the tables", [part]))
    return page


def _differing(task: str, settings: list[str]) -> Paragraph:
    """The note on `task`'s settings that differ between the mechanisms it compares
    (ablations.selection.differing_settings)."""
    return Paragraph(
        f"Not one setting: {task}'s mechanisms were trained with different settings that no "
        f"column shows (each mechanism's cells share them): {'; '.join(settings)}."
    )


def _interval_text(
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


def _selection_section(
    cells: pd.DataFrame, selection: Selection, folder: Path
) -> tuple[Section, set[str]]:
    """Each mechanism at its best setting of `selection.over` (ablations.selection.select) per
    task, size and other axes, with each of its reported metrics; the paired differences
    `selection.compare` names. Writes selection.csv and paired.csv (a `reported` column per
    metric's rows); returns the section and the rows of `cells` (its index) at the chosen
    settings. ValueError naming a reported metric no cell has."""
    over = _over(cells, selection)
    metric, reported = selection.metric, selection.reported_metrics
    for name in reported:
        if name not in cells.columns or cells[name].isna().all():
            have = sorted(
                c for c in cells.columns if c.startswith("test_") and cells[c].notna().any()
            )
            raise ValueError(
                f"selection.reported names {name!r}, which no cell of the report has "
                f"(test metrics there: {', '.join(have) or 'none'})"
            )
    chosen = {name: select(cells, over, metric, name, tuple(reported)) for name in reported}
    margin = selection.equivalence_margin
    family = verdicts(  # one family: every difference the report shows
        pd.concat(
            [
                paired(cells, chosen[name], a, b, name, margin)
                for name in reported
                for a, b in selection.compare
            ]
            or [paired(cells, chosen[reported[0]].iloc[:0], "", "", "")],
            ignore_index=True,
        ),
        margin,
    )
    write_csv(
        pd.concat([c.assign(reported=name) for name, c in chosen.items()]).drop(
            columns=["seeds", "rows"], errors="ignore"
        ),
        _new_file(folder, "selection.csv"),
    )
    write_csv(family.assign(margin=margin)[PAIRED_CSV], _new_file(folder, "paired.csv"))
    first = chosen[reported[0]]  # the settings: the same for every reported metric
    better = "highest" if higher_is_better(metric) else "lowest"
    parts: list = [Paragraph(
        f"Each mechanism at its best setting of {', '.join(over) or 'no axis (nothing swept)'}: "
        f"the setting with the {better} mean {metric} over seeds, among the settings whose "
        f"every seed finished with finite metrics (eligible of tried; the others excluded, "
        f"with why), per task, size and other axes; "
        f"{', '.join(reported)} at that setting: mean and 95% confidence interval over seeds "
        f"(Student's t). Bold: the best of its task, size and other axes. Data: selection.csv."
    )]  # fmt: skip
    if first.empty:
        parts.append(Paragraph("No cells."))
    else:
        data = pd.DataFrame({
            "task": first.task.astype(str),
            "size": first["size"].astype(str),
            "mechanism": first.mechanism.astype(str),
            **({"other axes": first.others} if first.others.astype(bool).any() else {}),
            "best setting": first.best.astype(str),
            f"{metric} (mean)": first.chosen_on.map(lambda v: "-" if pd.isna(v) else f"{v:.3f}"),
        })  # fmt: skip
        bold = {}
        for name, table in chosen.items():
            sign = 1 if higher_is_better(name) else -1
            group = table.groupby(["task", "size", "others"], sort=False, dropna=False)["mean"]
            bold[f"{name} [95% CI]"] = (sign * table["mean"]).eq(
                group.transform(lambda m, sign=sign: (sign * m).max())
            )
            data[f"{name} [95% CI]"] = [
                _interval_text(m, lo, hi, n)
                for m, lo, hi, n in zip(table["mean"], table.low, table.high, table.n, strict=True)
            ]
        data["eligible of tried"] = [
            f"{c} of {t}" for c, t in zip(first.candidates, first.settings, strict=True)
        ]
        if first.excluded.astype(bool).any():  # which settings are not eligible, and why
            data["excluded (why)"] = [
                f"no eligible setting: {why}" if best == "-" else why
                for best, why in zip(first.best, first.excluded, strict=True)
            ]
        marks = pd.DataFrame(False, index=data.index, columns=data.columns)
        for column, best in bold.items():
            marks[column] = best.to_numpy()
        parts.append(Table(data, marks))
    if selection.compare:
        parts.append(Paragraph(_paired_method(family, reported, margin)))
        head = family[family.reported == reported[0]].reset_index(drop=True)
        table = pd.DataFrame({
            "task": head.task.astype(str),
            "size": head["size"].astype(str),
            **({"other axes": head.others} if head.others.astype(bool).any() else {}),
            "a − b": [f"{a} − {b}" for a, b in zip(head.a, head.b, strict=True)],
        })  # fmt: skip
        for name in reported:
            pair = family[family.reported == name].reset_index(drop=True)
            prefix = f"{name} " if len(reported) > 1 else ""
            table[f"{name} difference [95% CI]"] = [
                _interval_text(m, lo, hi, n, signed=True)
                for m, lo, hi, n in zip(pair["mean"], pair.low, pair.high, pair.n, strict=True)
            ]
            table[f"{prefix}p"] = pair.p.map(_p_text)
            table[f"{prefix}p Holm"] = pair.p_holm.map(_p_text)
            if margin is not None:
                table[f"{prefix}TOST p Holm"] = pair.tost_p_holm.map(_p_text)
            table[f"{prefix}verdict"] = pair.verdict
        if (head.n < 2).any():  # a '-' says why
            table["why"] = [
                "" if n >= 2 else "n < 2: no test" if n else "no seed both finished" for n in head.n
            ]
        parts.append(Table(table))
    rows = {i for found in first.get("rows", pd.Series(dtype=object)).dropna() for i in found}
    return Section("Selection: each mechanism at its best setting", parts), rows


def _p_text(p: float) -> str:
    """A p-value as shown: '0.012', '<0.001'; '-' for none."""
    return "-" if pd.isna(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def _paired_method(family: pd.DataFrame, reported: list[str], margin: float | None) -> str:
    """How the paired differences of `family` (`verdicts`' rows, every metric's) are
    computed and judged: the paragraph above their table, with the family's size."""
    size = int(family.p.notna().sum())
    if margin is None:
        equivalence = (
            "The grid sets no selection.equivalence_margin, so no difference is called equivalent."
        )
    else:
        m = f"{margin:g}"
        equivalence = (
            f"'Equivalent within ±{m}' (the grid's selection.equivalence_margin, in the "
            f"metric's units): the two one-sided tests (TOST) reject both δ ≤ −{m} and "
            f"δ ≥ +{m}; p_TOST, the larger of P(T ≥ (d + {m})/se) and P(T ≤ (d − {m})/se), "
            f"Holm-adjusted across the same family (TOST p Holm) is below 0.05 (unadjusted, "
            f"p_TOST < 0.05 is the 90% interval lying inside ±{m}); a difference that is "
            f"also ahead reads 'a ahead, by less than {m}'."
        )
    return (
        f"Paired differences of {', '.join(reported)}: a − b, each mechanism at its own best "
        "setting, seed by seed over the n seeds both finished: their mean d, standard error "
        "se = s/√n (s: their standard deviation) and 95% interval d ± t(0.975, n−1)·se, "
        "unadjusted. p: the two-sided paired t test of no difference (δ = 0), T = d/se with "
        "n−1 degrees of freedom. The family: every difference this table shows, of every "
        f"metric, {size} tests; p Holm is Holm's step-down adjustment across them (the i-th "
        f"smallest p times {size} − i + 1, made non-decreasing, at most 1), which keeps the "
        "chance of any false 'ahead' in this report at most 5%. Verdict: 'a ahead' or 'b "
        "ahead' (the better one: d > 0 favours a in an accuracy, d < 0 in a loss) where "
        "p Holm < 0.05, so an interval that excludes 0 can "
        f"still be no clear difference. {equivalence} 'No clear difference' is not evidence "
        "of no difference. Data: paired.csv."
    )


def _attention_sections(
    store: ResultsStore,
    folder: Path,
    keys: set[str] | None = None,
    prefer: set[str] | None = None,
    progress: Steps | None = None,
) -> list[Section]:
    """The "Attention maps" section (none without maps) from ablations.attention_figures's blocks:
    ("h2", heading) then ("p", text), ("ul", items) and ("img", file, alt) parts."""
    blocks = attention_blocks(store, folder, keys, prefer, progress)
    if not blocks:
        return []
    _write_attention_file(folder, blocks)
    return [_blocks_section(blocks)]


def _write_attention_file(folder: Path, blocks: list) -> None:
    """The attention-map `blocks` as attention.json in `folder`: what a report rebuilt from the
    cells.csv beside it reads back (ablations.cells_file.read_attention) to carry the maps over."""
    _new_file(folder, ATTENTION_FILE).write_text(json.dumps(blocks), encoding="utf-8")


def _blocks_section(blocks: list, first: Sequence[Paragraph] = ()) -> Section:
    """The section of attention-map `blocks` (("h2", heading), then ("p", text), ("ul", items)
    and ("img", file, alt)), the paragraphs `first` before them."""
    (_, heading), *parts = blocks
    kinds = {"p": Paragraph, "ul": Bullets, "img": Image}
    return Section(heading, [*first, *(kinds[kind](*content) for kind, *content in parts)])


def _carried_attention_sections(
    attention: tuple[list[list], dict[str, bytes]], folder: Path
) -> list[Section]:
    """The attention maps of the report a cells.csv came from (`CellsFile.attention`: its blocks
    and PNG files), written into `folder` again with their attention.json, so that rebuilding a
    report from its cells.csv keeps them; an image whose file was not beside the cells.csv is
    named in a note instead."""
    blocks, files = attention
    missing = list(dict.fromkeys(n for kind, n, *_ in blocks if kind == "img" and n not in files))
    kept = [block for block in blocks if block[0] != "img" or block[1] in files]
    for name, data in files.items():
        _new_file(folder, name).write_bytes(data)
    _write_attention_file(folder, blocks)  # the missing images too: a rebuild names them again
    lead = "Carried over" if files else "Nothing carried over"
    first = [Paragraph(
        f"{lead} from the report whose cells.csv this one was rebuilt from (maps are drawn "
        "from the files beside a store, which a cells.csv does not hold)."
        + (f" Not carried, their files missing beside the cells.csv: {', '.join(missing)}."
           if missing else "")
    )]  # fmt: skip
    return [_blocks_section(kept, first)]
