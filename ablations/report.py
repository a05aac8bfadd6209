"""Reports of a grid's results store: tables, plots, markdown and a self-contained HTML page.

`write_report(store, out_dir)` writes, under stable names:

    report.md            markdown for a code host: tables, links to the PNGs beside it
    index.html           one self-contained page: the same, PNGs embedded as base64 data URIs
    summary.csv          the main table, one row per (task, size, mechanism)
    cells.csv            one row per cell, config and metrics flattened to dotted columns
    curves_<task>.png    validation accuracy vs step, per mechanism (and size): mean, min-max band
    vs_params_<task>.png test accuracy vs parameters, one point per mechanism and size
    vs_train_size_<family>.png  test accuracy vs n_train, where a task family's n_train varies
    attention_<cell>.png attention maps of checkpointed cells (ablations.attention)

where <task>, <family> and <cell> are `label_file_name`'s slug and hash of the label (e.g.
``curves_pairs-v64_3fa2c1d0.png``): two labels never share a file, and no label can name a file
outside the folder. Labels and notes are shown as text on both pages (see
ablations.report_pages); a missing or unreadable checkpoint leaves its attention map out with
a note. The folder is written whole or not at all: see `write_report`.

A task is grouped by its label (`config["task"]`). A task family is a registered task with its
kwargs other than the split sizes (e.g. ``relational_games (problem=same)``): the training-set
size plots and table put the labels of one family side by side by `task_kwargs["n_train"]`.
Failed, diverged and unfinished cells are listed in their own section, never dropped.
"""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import datetime
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ablations.attention import attention_blocks
from ablations.report_pages import (
    label_colours,
    label_file_name,
    new_figure,
    path_in,
    plot_text,
    write_pages,
)
from ablations.store import ResultsStore, error_summary

SUMMARY_COLUMNS = [
    "task",
    "size",
    "mechanism",
    "cells",
    "seeds",
    "test_acc_mean",
    "test_acc_std",
    "target",
    "reached",
    "steps_to_target",
    "samples_to_target",
    "params",
    "step_ms",
]
SPLIT_SIZES = ("n_train", "n_validation", "n_test")
REPORT_SUFFIXES = (".md", ".html", ".csv", ".png")  # what a report folder may hold
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v"]


FIELDS = {  # tidy column of a cell: its column in the flattened store frame
    "size": "config.size.label",
    "mechanism": "config.mechanism",
    "seed": "config.seed",
    "status": "status",
    "n_train": "config.task_kwargs.n_train",
    "batch_size": "config.training.batch_size",
    "early_stop_target": "config.training.early_stop_target",
    "test_acc": "metrics.test_acc",
    "params": "metrics.params",
    "step_ms": "metrics.step_ms",
    "diverged_at": "metrics.diverged_at",
    "error": "error",
    "curve": "curve",
}


def _cells(df: pd.DataFrame) -> pd.DataFrame:
    """One tidy row per cell: task label and name, other labels, status and the numbers the
    report uses."""
    flat = pd.json_normalize(df.to_dict("records"), sep=".")
    missing = pd.Series(float("nan"), index=flat.index)
    cells = {"task": flat.get("config.task", missing), "family": df.apply(_family, axis=1)}
    cells.update({column: flat.get(field, missing) for column, field in FIELDS.items()})
    return pd.DataFrame(cells)


def _family(row: pd.Series) -> str:
    """The registered task with its kwargs other than split sizes: 'name (k=v, ...)'."""
    kwargs = row.get("config.task_kwargs") or {}
    other = [f"{k}={v}" for k, v in sorted(kwargs.items()) if k not in SPLIT_SIZES]
    name = row.get("config.task_name")
    return f"{name} ({', '.join(other)})" if other else str(name)


def _first_step(curve: list | None, target: float) -> int | None:
    """The first evaluated step whose validation metric reaches `target`, or None."""
    for step, _train_loss, _val_loss, val_metric in curve or []:
        if val_metric >= target:
            return step
    return None


def summary_table(df: pd.DataFrame, target: float | None = None) -> pd.DataFrame:
    """The main table from `ResultsStore.to_dataframe()`: per task,
    size and mechanism, over the seeds that finished (`seeds`, of `cells` in all), test accuracy
    mean and std; the target validation accuracy (`target`, else the cells' nonzero
    training.early_stop_target, else none), how many seeds `reached` it and their mean steps and
    samples (steps x batch size) to first reach it; mean parameters and ms per step.
    Rows follow the order the cells started in."""
    cells = _cells(df)
    rows = []
    for (task, size, mechanism), group in cells.groupby(
        ["task", "size", "mechanism"], sort=False, dropna=False
    ):
        done = group[group.status == "done"]
        goal = target if target is not None else group.early_stop_target.iloc[0]
        goal = goal if goal and pd.notna(goal) else float("nan")
        steps, samples = [], []
        if pd.notna(goal):
            for curve, batch_size in zip(done.curve, done.batch_size, strict=True):
                step = _first_step(curve, goal)
                if step is not None:
                    steps.append(step)
                    samples.append(step * batch_size)
        rows.append(
            {
                "task": task,
                "size": size,
                "mechanism": mechanism,
                "cells": len(group),
                "seeds": len(done),
                "test_acc_mean": done.test_acc.mean(),
                "test_acc_std": done.test_acc.std(),
                "target": goal,
                "reached": len(steps),
                "steps_to_target": pd.Series(steps, dtype=float).mean(),
                "samples_to_target": pd.Series(samples, dtype=float).mean(),
                "params": done.params.mean(),
                "step_ms": done.step_ms.mean(),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _best(table: pd.DataFrame) -> dict[str, pd.Series]:
    """Per metric column, the rows holding the best value: highest accuracy; fewest steps and
    samples among the rows where the most seeds reached the target; fewest parameters and ms."""
    best = {}
    for column, higher in (("test_acc_mean", True), ("params", False), ("step_ms", False)):
        values = table[column]
        best[column] = values == (values.max() if higher else values.min())
    share = table.reached / table.seeds
    most = (share == share.max()) & (share > 0)
    for column in ("steps_to_target", "samples_to_target"):
        values = table[column].where(most)
        best[column] = values == values.min()
    return best


def _mean_std(mean: float, std: float) -> str:
    """'0.912 ± 0.013'; without '±' where there is no std (one seed); '-' without a mean."""
    if pd.isna(mean):
        return "-"
    return f"{mean:.3f}" if pd.isna(std) else f"{mean:.3f} ± {std:.3f}"


def _task_table(table: pd.DataFrame) -> tuple[list[str], list[list[tuple[str, bool]]]]:
    """Header and rows of one task's table; each cell is (text, is the task's best)."""
    best = _best(table)
    target = table.target.dropna()
    header = ["size", "mechanism", "seeds", "test acc"]
    if len(target):
        header += [f"steps to val acc ≥ {target.iloc[0]:g}", "samples to target"]
    header += ["params", "ms/step"]
    rows = []
    for i, row in table.iterrows():
        seeds = f"{row.seeds}" if row.seeds == row.cells else f"{row.seeds} of {row.cells}"
        acc = _mean_std(row.test_acc_mean, row.test_acc_std)
        cells = [(row["size"], False), (row.mechanism, False), (seeds, False)]
        cells.append((acc, bool(best["test_acc_mean"][i])))
        if len(target):
            reached = f" ({row.reached}/{row.seeds})"
            for column in ("steps_to_target", "samples_to_target"):
                value = row[column]
                text = "-" if pd.isna(value) else f"{value:,.0f}"
                cells.append((text + reached, bool(best[column][i])))
        params = "-" if pd.isna(row.params) else f"{row.params:,.0f}"
        step_ms = "-" if pd.isna(row.step_ms) else f"{row.step_ms:.1f}"
        cells += [(params, bool(best["params"][i])), (step_ms, bool(best["step_ms"][i]))]
        rows.append(cells)
    return header, rows


def _detail(cell: pd.Series) -> str:
    """Why a cell is not in the tables: the traceback's last line, or its divergence step."""
    if cell.status == "failed":
        return error_summary(cell.error)
    if cell.status == "diverged":
        step = cell.diverged_at
        return "loss diverged" if pd.isna(step) else f"loss diverged at step {step:.0f}"
    return "unfinished: still running, or its run was interrupted"


def _plot_curves(task: str, done: pd.DataFrame, colours: dict) -> Figure | None:
    """Validation accuracy vs step per mechanism (and size): mean line and min-max band over
    seeds; a seed that stopped early holds its last value."""
    figure, ax = new_figure()
    sizes = list(dict.fromkeys(done["size"]))
    for (size, mechanism), group in done.groupby(["size", "mechanism"], sort=False):
        runs = [pd.Series({p[0]: p[3] for p in curve}) for curve in group.curve if curve]
        if not runs:
            continue
        frame = pd.concat(runs, axis=1).sort_index().ffill()
        label = plot_text(mechanism if len(sizes) == 1 else f"{mechanism} ({size})")
        style = LINESTYLES[sizes.index(size) % len(LINESTYLES)]
        colour = colours[mechanism]
        ax.plot(frame.index, frame.mean(axis=1), style, color=colour, label=label)
        ax.fill_between(frame.index, frame.min(axis=1), frame.max(axis=1), color=colour, alpha=0.2)
    if not ax.lines:
        return None
    ax.set(xlabel="step", ylabel="validation accuracy", title=plot_text(f"{task}: learning curves"))
    ax.legend(fontsize="small")
    return figure


def _plot_vs_params(task: str, table: pd.DataFrame, colours: dict) -> Figure | None:
    """Test accuracy vs parameters, one point per mechanism and size, error bars = std."""
    table = table[table.seeds > 0]
    if table.empty:
        return None
    figure, ax = new_figure()
    sizes = list(dict.fromkeys(table["size"]))
    for _, row in table.iterrows():
        label = row.mechanism if len(sizes) == 1 else f"{row.mechanism} ({row['size']})"
        label = plot_text(label)
        marker = MARKERS[sizes.index(row["size"]) % len(MARKERS)]
        error = 0.0 if pd.isna(row.test_acc_std) else row.test_acc_std
        ax.errorbar(
            row.params, row.test_acc_mean, yerr=error, fmt=marker, capsize=3,
            color=colours[row.mechanism], label=label,
        )  # fmt: skip
    ax.set_xscale("log")
    title = plot_text(f"{task}: accuracy vs parameters")
    ax.set(xlabel="parameters", ylabel="test accuracy", title=title)
    ax.legend(fontsize="small")
    return figure


def _train_size_table(done: pd.DataFrame) -> tuple[list[str], list[list[tuple[str, bool]]]]:
    """Rows n_train (and size), columns mechanism: test accuracy mean ± std (seeds); best bold."""
    stats = done.groupby(["n_train", "size", "mechanism"], sort=False).test_acc.agg(
        ["mean", "std", "count"]
    )
    mechanisms = list(dict.fromkeys(done.mechanism))
    header = ["n_train", "size", *mechanisms]
    rows = []
    for (n_train, size), group in stats.groupby(level=[0, 1], sort=True):
        group = group.droplevel([0, 1])
        best = group["mean"].max()
        row = [(f"{n_train:.0f}", False), (str(size), False)]
        for mechanism in mechanisms:
            if mechanism not in group.index:
                row.append(("-", False))
                continue
            m, sd, n = group.loc[mechanism]
            row.append((f"{_mean_std(m, sd)} ({n:.0f})", m == best))
        rows.append(row)
    return header, rows


def _plot_vs_train_size(task_name: str, done: pd.DataFrame, colours: dict) -> Figure:
    """Test accuracy (mean, error bars = std over seeds) vs n_train, per mechanism and size."""
    figure, ax = new_figure()
    sizes = list(dict.fromkeys(done["size"]))
    for (size, mechanism), group in done.groupby(["size", "mechanism"], sort=False):
        stats = group.groupby("n_train").test_acc.agg(["mean", "std"]).fillna({"std": 0.0})
        label = plot_text(mechanism if len(sizes) == 1 else f"{mechanism} ({size})")
        style = LINESTYLES[sizes.index(size) % len(LINESTYLES)]
        ax.errorbar(
            stats.index, stats["mean"], yerr=stats["std"], fmt="o" + style, capsize=3,
            color=colours[mechanism], label=label,
        )  # fmt: skip
    n_train = sorted(done.n_train.unique())
    ax.set_xscale("log")
    ax.set_xticks(n_train, labels=[f"{n:.0f}" for n in n_train])
    ax.minorticks_off()
    ax.set(xlabel="training examples (n_train)", ylabel="test accuracy")
    ax.set_title(plot_text(f"{task_name}: accuracy vs training-set size"))
    ax.legend(fontsize="small")
    return figure


def _environment(store: ResultsStore) -> str:
    """The distinct (torch, machine, threads, commit) the cells ran with."""
    seen = []
    for row in store.rows():
        env = row["environment"] or {}
        keys = ("torch", "machine", "threads", "commit")
        text = ", ".join(f"{k} {env[k]}" for k in keys if k in env)
        if text and text not in seen:
            seen.append(text)
    return "; ".join(seen) or "not recorded"


def _cells_csv(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per cell, config and metrics flattened to sorted dotted columns, no curve."""
    flat = pd.json_normalize(frame.to_dict("records"), sep=".")
    flat = flat.drop(columns="curve", errors="ignore")
    first = [c for c in ("key", "status") if c in flat]
    last = [c for c in ("error", "started", "finished") if c in flat]
    return flat[first + sorted(c for c in flat if c not in first + last) + last]


def _header(
    store: ResultsStore, frame: pd.DataFrame, cells: pd.DataFrame, title: str | None
) -> list[tuple]:
    """Title, grid names, cells by status, environment, date, and how to read the tables."""
    grids = sorted(set(frame.get("config.grid", [])))
    counts = cells.status.value_counts()
    statuses = ", ".join(
        f"{counts.get(s, 0)} {s}" for s in ("done", "failed", "diverged", "running")
    )
    return [
        ("h1", title or "Ablation report: " + (", ".join(grids) or "empty store")),
        (
            "ul",
            [
                f"Grid: {', '.join(grids) or '-'} (store {store.path})",
                f"Cells: {len(cells)} ({statuses})",
                f"Environment: {_environment(store)}",
                f"Generated: {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
            ],
        ),
        (
            "p",
            "Test accuracy: mean ± std over the seeds that finished (seeds: finished, of all). "
            "Steps to target: the first evaluated step whose validation accuracy reaches the "
            "target, mean over the seeds that reached it (reached/finished); samples = steps × "
            "batch size. Bold: best in the task (highest accuracy; fewest steps and samples "
            "among the rows where most seeds reached the target; fewest parameters; lowest "
            "ms/step). Learning curves: mean line and min-max band over seeds (a seed that "
            "stopped early holds its last value). Data: summary.csv, cells.csv.",
        ),
    ]


def write_report(
    store: str | Path | ResultsStore,
    out_dir: str | Path,
    title: str | None = None,
    target: float | None = None,
    note: str | None = None,
) -> Path:
    """Write the report of `store` (a ResultsStore or the path of its SQLite file) into the
    folder `out_dir`: report.md, index.html, summary.csv, cells.csv and the PNG plots, with
    attention maps of the cells that kept checkpoints. `target` is the validation accuracy for
    steps-to-target (default: the cells' training.early_stop_target when nonzero); `note` a
    paragraph shown under the header (e.g. the conclusion), the one text whose markdown
    report.md keeps (raw HTML in it is escaped, see ablations.report_pages). Returns `out_dir`.

    The folder belongs to the report and is written whole or not at all: the report is written
    into a new hidden sibling folder (``.<name>.partial-<pid>-<random>``), which then replaces
    `out_dir` (the old folder is renamed away, the new one renamed in, the old one deleted), so
    files in `out_dir` that this report does not write are deleted with the previous report,
    and an error on the way leaves the previous report as it was and no partial folder behind.
    To keep other files safe, `out_dir` must be missing, empty, or a previous report: a folder
    of .md, .html, .csv and .png files holding report.md (FileExistsError otherwise)."""
    if not isinstance(store, ResultsStore):
        if not Path(store).is_file():
            raise FileNotFoundError(f"no results store at {store}")
        store = ResultsStore(store)
    final = Path(out_dir).resolve()
    _check_replaceable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    partial.mkdir()
    try:
        _write_files(store, partial, title, target, note)
        _replace_folder(partial, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already unless something failed
    return Path(out_dir)


def _check_replaceable(folder: Path) -> None:
    """FileExistsError unless `folder` is missing, empty or a previous report (only top-level
    .md, .html, .csv and .png files or links, report.md among them): replacing it deletes what
    it holds (a link itself, never what it points to)."""
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


def _replace_folder(new: Path, final: Path) -> None:
    """Put folder `new` in the place of `final`: rename the old one away, rename `new` in,
    then delete the old one (renaming the old one back if `new` cannot be renamed in)."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        final.rename(old)
    try:
        new.rename(final)
    except BaseException:
        if old is not None:
            old.rename(final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _new_file(folder: Path, name: str) -> Path:
    """The path of a new file `name` directly inside `folder` (see report_pages.path_in);
    FileExistsError if the report already wrote a file of that name."""
    path = path_in(folder, name)
    if path.exists():
        raise FileExistsError(f"two files of the report are named {name}: a name collision")
    return path


def _write_files(
    store: ResultsStore, folder: Path, title: str | None, target: float | None, note: str | None
) -> None:
    """Write every file of the report into the new, empty `folder`."""
    frame = store.to_dataframe()
    cells = _cells(frame)
    summary = summary_table(frame, target)

    _cells_csv(frame).to_csv(_new_file(folder, "cells.csv"), index=False)
    summary.to_csv(_new_file(folder, "summary.csv"), index=False)
    blocks = _header(store, frame, cells, title) + ([("note", note)] if note else [])

    colours = label_colours(cells.mechanism.dropna())
    done = cells[cells.status == "done"]
    for task, table in summary.groupby("task", sort=False):
        blocks += [("h2", f"Task: {task}"), ("table", *_task_table(table.reset_index(drop=True)))]
        figures = [
            ("curves", _plot_curves(task, done[done.task == task], colours), "learning curves"),
            ("vs_params", _plot_vs_params(task, table, colours), "accuracy vs parameters"),
        ]
        for kind, figure, alt in figures:
            if figure is not None:
                name = label_file_name(kind, str(task))
                figure.savefig(_new_file(folder, name), dpi=100)
                blocks.append(("img", name, f"{task}: {alt}"))

    for family, group in done.dropna(subset=["n_train"]).groupby("family", sort=False):
        if group.n_train.nunique() > 1:
            name = label_file_name("vs_train_size", str(family))
            _plot_vs_train_size(family, group, colours).savefig(_new_file(folder, name), dpi=100)
            blocks += [
                ("h2", f"Training-set size: {family}"),
                ("p", "Test accuracy, mean ± std (seeds); bold: the best mechanism per row."),
                ("table", *_train_size_table(group)),
                ("img", name, f"{family}: accuracy vs training-set size"),
            ]

    blocks += attention_blocks(store, folder)
    unfinished = cells[cells.status != "done"]
    blocks.append(("h2", "Cells not in the tables"))
    if unfinished.empty:
        blocks.append(("p", "None: every cell finished."))
    else:
        header = ["task", "size", "mechanism", "seed", "status", "detail"]
        rows = [
            [(str(c[k]), False) for k in header[:-1]] + [(_detail(c), False)]
            for _, c in unfinished.iterrows()
        ]
        blocks.append(("table", header, rows))

    write_pages(blocks, folder)
