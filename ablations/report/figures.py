"""A report's figures: learning curves (with the loss floor where a task knows it), a metric
against parameters and against training-set size; one matplotlib Figure each, drawn when the
page asks (ablations/report/build.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, NullFormatter

from ablations.grid.schema import Selection
from ablations.report.headline import RecordedCurve
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
TICK_CHARS = 24  # at most this many characters of a label on a categorical axis


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


def headline_axis(chosen: pd.DataFrame) -> str:
    """The x axis of the headline figure of `chosen` (`select`'s rows: the axes not chosen
    over, the grid's swept keys first): the first of its axes that takes several values (e.g.
    task_kwargs.n_train, a length), else "size" where the model sizes differ, else "task"."""
    for column in axis_columns(chosen):
        if chosen[column].nunique() > 1:
            return column
    return "size" if chosen["size"].nunique() > 1 else "task"


def reference_column(axis: str) -> str:
    """A reference curve file's column of the headline axis `axis`: the swept key's last part
    ("n_train" for "task_kwargs.n_train"), "size" or "task"."""
    return axis.rsplit(".", 1)[-1]


MAX_TICKS = 8  # a numeric axis with more values than this keeps matplotlib's ticks


def _positions(values: pd.Series) -> tuple[dict[str, float], bool]:
    """Each value of an axis (as text) at its place on the x axis, and whether the axis is
    numeric: its number where every value is one, else its rank in order of appearance."""
    texts = list(dict.fromkeys(values.astype(str)))
    numbers = pd.to_numeric(pd.Series(texts), errors="coerce")
    if numbers.notna().all():
        return dict(zip(texts, numbers.astype(float), strict=True)), True
    return {text: float(i) for i, text in enumerate(texts)}, False


def reference_rows(curve: RecordedCurve, axis: str, metric: str) -> pd.DataFrame:
    """The rows of a reference curve file (`curve.rows`) as task, model, the `axis` column
    (`reference_column`) and `value` (its `column`, default "<metric>_mean"); ValueError
    naming the file, the missing columns and the columns it has."""
    rows, column = pd.DataFrame(curve.rows), curve.column or f"{metric}_mean"
    needed = list(dict.fromkeys(["task", "model", reference_column(axis), column]))
    missing = [name for name in needed if name not in rows.columns]
    if missing:
        raise ValueError(
            f"[report] reference_curves file {curve.file} has no column {', '.join(missing)} "
            f"(its columns: {', '.join(map(str, rows.columns)) or 'none'}); the headline figure "
            f"draws {metric} against {axis}, so the file needs {', '.join(needed)} (set the "
            "entry's `column` to name its value column)"
        )
    keys = rows[["task", "model", reference_column(axis)]]
    return keys.assign(value=pd.to_numeric(rows[column], errors="coerce"))


def plot_headline(
    chosen: pd.DataFrame,
    metric: str,
    colours: dict,
    references: Sequence[RecordedCurve] = (),
) -> Figure | None:
    """The headline figure: `metric` of each mechanism at its selected setting (`chosen`,
    `select`'s rows) against the `headline_axis`, one panel per task (one panel of all tasks
    where the axis is the task): mean over seeds, band (error bars across tasks) its 95%
    interval; a line per mechanism (and size, and setting of other varying axes), coloured by
    `colours`; each reference curve (`RecordedCurve`: a file's rows, per model) dashed in
    black. None where no mechanism has a mean. ValueError naming a reference file without the
    axis's or the value's column."""
    points = chosen.dropna(subset=["mean"]) if "mean" in chosen else chosen
    if points.empty:
        return None
    axis = headline_axis(chosen)
    per_task = axis == "task"
    panels = [("", points)] if per_task else list(points.groupby("task", sort=False))
    place, numeric = _positions(points[axis])
    columns = min(len(panels), 3)
    figure = Figure(
        figsize=(max(6.4, 4.2 * columns), 3.6 * -(-len(panels) // columns)), layout="constrained"
    )
    FigureCanvasAgg(figure)
    grid = figure.subplots(-(-len(panels) // columns), columns, squeeze=False).ravel()
    sizes = list(dict.fromkeys(points["size"]))
    rest = [c for c in axis_columns(points) if c != axis and points[c].nunique() > 1]
    several_sizes = len(sizes) > 1 and axis != "size"
    shown: set[str] = set()  # the labels in the legend: each once, however many panels

    def once(label: str) -> str:
        first = label not in shown
        shown.add(label)
        return label if first else "_nolegend_"

    for ax, (task, group) in zip(grid, panels, strict=False):
        lines = group.groupby(["mechanism", "size", *rest], sort=False, dropna=False)
        for i, ((mechanism, size, *_), line) in enumerate(lines):
            setting = setting_text(line.iloc[0], rest)
            label = plot_text(_curve_label(mechanism, size, setting, several_sizes))
            x = line[axis].astype(str).map(place)
            line = line.assign(x=x).sort_values("x")
            colour = colours[mechanism]
            if per_task:  # a point per task, side by side: no line between tasks
                spread = (line["high"] - line["mean"]).fillna(0.0)
                ax.errorbar(
                    line.x + 0.08 * (i - (lines.ngroups - 1) / 2), line["mean"], yerr=spread,
                    fmt=MARKERS[sizes.index(size) % len(MARKERS)], capsize=3, color=colour,
                    label=once(label),
                )  # fmt: skip
            else:
                ax.plot(line.x, line["mean"], "o-", color=colour, label=once(label))
                ax.fill_between(line.x, line["low"], line["high"], color=colour, alpha=0.2)
        for n, curve in enumerate(references):
            rows = reference_rows(curve, axis, metric)
            if not per_task:
                rows = rows[rows.task.astype(str) == str(task)]
            for m, (model, found) in enumerate(rows.groupby("model", sort=False)):
                given = found[reference_column(axis)]  # numeric: every value of the file's
                x = given.astype(str).map(place)
                if numeric:
                    x = pd.to_numeric(given, errors="coerce")
                found = found.assign(x=x).dropna(subset=["x", "value"]).sort_values("x")
                label = plot_text(f"{curve.label}: {model}")
                style = LINESTYLES[1:][n % 3]
                ax.plot(found.x, found.value, style, color="black", label=once(label),
                        marker=MARKERS[m % len(MARKERS)], markersize=4)  # fmt: skip
        if not numeric:  # a categorical axis: its values by name, tilted where they crowd
            ticks = [plot_text(short_label(text, TICK_CHARS)) for text in place]
            ax.set_xticks(list(place.values()), labels=ticks)
            ax.tick_params(axis="x", labelrotation=20 if len(place) > 3 else 0)
        else:  # the values the grid ran, as written (one value: one tick, not a scale)
            values = sorted(set(group[axis].astype(str).map(place)))
            if len(values) <= MAX_TICKS:
                ax.set_xticks(values, labels=[f"{v:g}" for v in values])
        ax.set(xlabel=axis, ylabel=metric_name(metric))
        if not per_task and len(panels) > 1:
            ax.set_title(plot_title(short_label(task, TITLE_LABEL)))
        bounded(ax, metric)
    for ax in grid[len(panels) :]:
        ax.set_visible(False)
    figure.suptitle(plot_title(f"{metric_name(metric)} vs {axis}: each mechanism at its "
                               "selected setting, 95% interval"))  # fmt: skip
    legend(figure, grid[0], outside=True)
    return figure
