"""A report's figures: learning curves (with the loss floor where a task knows it), a metric
against parameters and against training-set size; one matplotlib Figure each, drawn when the
page asks (ablations/report/build.py)."""

from __future__ import annotations

import json

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, NullFormatter

from ablations.grid.schema import Selection
from ablations.report.pages import (
    TITLE_LABEL,
    legend,
    new_figure,
    plot_text,
    plot_title,
    short_label,
)
from ablations.report.selection import axis_columns, interval, setting_text, varying_per_task
from ablations.results.frames import is_missing

LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v"]
FIGURE_ALTS = {"curves": "learning curves", "loss_curves": "loss curves",
               "above_floor": "validation loss above the floor",
               "vs_params": "{metric} vs parameters"}  # fmt: skip
CURVE_COLUMNS = {"accuracy": "val_metric", "loss": "val_loss"}  # of ResultsStore.curves()
FLAT_PARAMS = 1.1  # parameter counts within this ratio: no figure against them


def bounded(ax, metric: str) -> None:
    """An accuracy's axis kept within [0, 1] (an interval's bound above 1 is cut at the
    frame; the tables print it unclipped); other metrics as drawn."""
    if metric in ("accuracy", "test_acc") or metric.endswith(("_acc", "_exact")):
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, 0.0), min(high, 1.0))


def plot_curves(
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
    value; `floor`, the lowest validation loss possible (`loss_floor`), a dotted black line,
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
    bounded(ax, metric)
    legend(figure, ax)
    return figure


def selected_axes(cells: pd.DataFrame, selection: Selection) -> list[str]:
    """The axis columns of `cells` that `selection` chooses a setting of: its `over`, or every
    axis where it names none."""
    columns = axis_columns(cells)
    return [c for c in selection.over or columns if c in columns]


def curve_panels(
    task: str, done: pd.DataFrame, selection: Selection | None
) -> list[tuple[str, pd.DataFrame]]:
    """The learning-curve plots of `task`'s cells `done`: one of them all, or with a
    selection, one per setting of the axes it does not choose over (e.g. n_train, pooling),
    each mechanism's curve labelled by its chosen setting only: ("<task>; <other axes>",
    its cells)."""
    if selection is None:
        return [(task, done)]
    over = selected_axes(done, selection)
    varying = varying_per_task(done, axis_columns(done)).get(task, [])
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


def metric_name(metric: str) -> str:
    """How plots name a reported metric: 'accuracy' for test_acc, else 'test loss' etc."""
    return "accuracy" if metric == "test_acc" else metric.replace("_", " ")


def loss_floor(configs: list[dict], done: pd.DataFrame) -> dict[str, float] | None:
    """The lowest mean loss any model can have on the validation and test splits of the done
    cells `done` of one task (`tidy_cells` rows; `configs`: the stored configs, by their
    index), as their training recorded it (metrics loss_floor_validation and loss_floor_test:
    the task's `loss_floors`): the mean over the splits those cells used, one per seed and
    setting of the task's arguments. None where a cell recorded none (a task without one, or
    a cell trained before floors were recorded)."""
    floors = {}
    for i, row in done.iterrows():
        config = configs[i]
        setting = (config["task_name"], json.dumps(config["task_kwargs"]), int(config["seed"]))
        floors[setting] = (row.loss_floor_validation, row.loss_floor_test)
    if not floors or any(is_missing(floor) for pair in floors.values() for floor in pair):
        return None
    ordered = [floors[setting] for setting in sorted(floors)]
    return {
        split: sum(pair[i] for pair in ordered) / len(ordered)
        for i, split in enumerate(("validation", "test"))
    }


def plot_vs_params(
    task: str, done: pd.DataFrame, colours: dict, metric: str = "test_acc"
) -> Figure | None:
    """`metric` vs parameters of the finished cells `done`: one point per mechanism, size and
    setting (the mean over seeds), error bars the 95% confidence interval over seeds; None
    where the parameter counts lie within `FLAT_PARAMS` of each other (the axis would show
    nothing but rounding: 3.87×10^5, 3.8725×10^5, ...)."""
    if done.empty or done.params.max() < FLAT_PARAMS * done.params.min():
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
    ax.xaxis.set_major_formatter(EngFormatter())  # 120 k, 1.5 M
    ax.xaxis.set_minor_formatter(NullFormatter())
    name = metric_name(metric)
    ax.set(xlabel="parameters", ylabel="test accuracy" if metric == "test_acc" else name)
    bounded(ax, metric)
    ax.set_title(plot_title(f"{short_label(task, TITLE_LABEL)}: {name} vs parameters"))
    legend(figure, ax)
    return figure


def plot_vs_train_size(
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
    bounded(ax, metric)
    ax.set_title(
        plot_title(f"{short_label(task_name, TITLE_LABEL)}: {metric} vs training-set size")
    )
    legend(figure, ax)
    return figure
