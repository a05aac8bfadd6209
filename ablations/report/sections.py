"""The report's per-task sections: one builder per section, each returning its sections and
the plots they show (drawn later, one at a time: ablations/report/build.py).

- `headline_section`: the answer the page leads with (with a [selection]): the verdict table
  and the headline figure;
- `task_sections`: per task, its summary table, the loss floor where the task knows one, its
  learning curves and metric-vs-parameters plots;
- `train_size_sections`: per task family and setting of the other axes, the metric against the
  training-set size, where n_train varies;
- `unfinished_section`: every cell not in the tables, with why.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import pandas as pd
from matplotlib.figure import Figure

from ablations.grid.schema import Selection
from ablations.report.figures import (
    FIGURE_ALTS,
    curve_panels,
    headline_axis,
    loss_floor,
    metric_name,
    plot_curves,
    plot_headline,
    plot_vs_params,
    plot_vs_train_size,
    reference_rows,
    selected_axes,
)
from ablations.report.headline import RecordedReport
from ablations.report.pages import Paragraph, Section, Table, label_file_name
from ablations.report.selection import axis_columns, setting_text, varying_per_task
from ablations.report.selection_section import Selected, differing_note
from ablations.report.tables import cell_detail, task_table, train_size_table

N_TRAIN_AXES = ("task_kwargs.n_train", "training.steps")  # what a training-set size varies
SHORTFALL = re.compile(r"\(n=\d+ of \d+\)")  # train_size_table's cell of a mechanism short of seeds


class Plot(NamedTuple):
    """A figure a section shows: drawn by `draw` (None: nothing to show) into `file`."""

    section: Section
    file: str
    alt: str
    draw: Callable[[], Figure | None]


def headline_section(
    selected: Selected, metric: str, colours: dict, recorded: RecordedReport | None
) -> Plot:
    """The section the page leads with, "Answer": the verdict table (`selected.verdicts`) and
    the headline figure (`plot_headline`: `metric` of each mechanism at its selected setting,
    and the `recorded` [report]'s reference curves) under its caption, naming their sources.
    ValueError before anything is drawn where a reference file lacks a column it needs."""
    curves = [] if recorded is None else recorded.reference_curves
    axis = "task" if selected.chosen.empty else headline_axis(selected.chosen)
    for curve in curves:  # each file checked now, not after the other plots
        reference_rows(curve, axis, metric)
    sources = "; ".join(f"{curve.label}: {curve.source}" for curve in curves)
    caption = Paragraph(
        f"Headline: {metric} against {axis}, each mechanism at its selected setting: mean "
        "over seeds, the band (error bars per task) its 95% interval (Student's t)"
        + (f"; dashed, black: reference curves ({sources})." if curves else ".")
    )
    section = Section("Answer", [*selected.verdicts, caption])
    draw = partial(plot_headline, selected.chosen, metric, colours, curves)
    return Plot(section, "headline.png", f"{metric} vs {axis}: the headline figure", draw)


def task_sections(
    summary: pd.DataFrame,
    plotted: pd.DataFrame,
    configs: list[dict],
    curves: pd.DataFrame | None,
    colours: dict,
    selection: Selection | None,
    metric: str,
    differing: dict[str, list[str]],
) -> tuple[list[Section], list[Plot]]:
    """One section per task of `summary` (`summary_table`): its table (every setting), the
    note on settings that differ between its mechanisms (`differing`), its loss floor, and the
    plots of the cells `plotted` (with a selection: each mechanism at its selected setting)
    showing `metric`; `configs` are the cells' stored configs, by the cells' index."""
    sections, plots = [], []
    for task, table in summary.groupby("task", sort=False):
        section = Section(f"Task: {task}", [task_table(table.reset_index(drop=True))])
        if str(task) in differing:
            section.parts.append(differing_note(str(task), differing[str(task)]))
        if selection is not None:
            section.parts.append(Paragraph(
                "The table: every setting. The plots: each mechanism at its selected "
                "setting (see Selection; not drawn where no setting finished on every seed)."
            ))  # fmt: skip
        figures, mine = [], plotted[plotted.task == task]  # (kind, label, draw): drawn later
        floor = loss_floor(configs, mine)
        if floor is not None:
            section.parts.append(Paragraph(
                f"Loss floor: no model can have a mean loss below {floor['test']:.3f} on these "
                f"test splits ({floor['validation']:.3f} on validation): the task's own "
                "probabilities give it (best_losses, mean over the seeds' splits)"
                + ("; the loss curves draw the validation floor, and a second plot each "
                   "curve's height above it on a log scale." if curves is not None else ".")
            ))  # fmt: skip
        val_floor = None if floor is None else floor["validation"]
        panels = [] if curves is None else curve_panels(str(task), mine, selection)
        for label, panel in panels:
            figures.append(("curves", label, partial(plot_curves, label, panel, curves, colours)))
            if panel.test_exact.notna().any():  # sequence tasks (scored per position)
                loss = partial(plot_curves, label, panel, curves, colours, "loss", val_floor)
                figures.append(("loss_curves", label, loss))
                if val_floor is not None:
                    figures.append(("above_floor", label, partial(loss, above_floor=True)))
        vs_params = partial(plot_vs_params, str(task), mine, colours, metric)
        figures.append(("vs_params", task, vs_params))
        for kind, label, draw in figures:
            alt = FIGURE_ALTS[kind].format(metric=metric_name(metric))
            plots.append(Plot(section, label_file_name(kind, str(label)), f"{label}: {alt}", draw))
        sections.append(section)
    return sections, plots


def train_size_sections(
    cells: pd.DataFrame,
    done: pd.DataFrame,
    selection: Selection | None,
    metric: str,
    colours: dict,
) -> tuple[list[Section], list[Plot]]:
    """One section per task family and setting of the axes other than n_train (and the steps
    an epoch count resolves to) where n_train varies among the finished cells `done` (with a
    selection: each mechanism at its selected setting, per n_train, and the first reported
    `metric`): the table and plot of `metric` against n_train."""
    others = [c for c in axis_columns(cells) if c not in N_TRAIN_AXES]
    described = "Test accuracy"
    if selection is not None:
        over = selected_axes(cells, selection)
        others = [c for c in others if c not in over]
        described = f"Each mechanism at its selected setting (see Selection): {metric}"
    varying = varying_per_task(done if selection is not None else cells, others)

    def with_others(frame: pd.DataFrame) -> pd.DataFrame:
        texts = [setting_text(row, varying.get(row.task, [])) for _, row in frame.iterrows()]
        return frame.assign(others=texts or "")

    done = with_others(done)
    planned = None  # with a selection, the selected settings are those every seed finished
    if selection is None:  # every cell of the grid, finished or not: a shortfall is shown
        planned = with_others(cells).groupby(["family", "others", "n_train", "size", "mechanism"],
                                             sort=False).size()  # fmt: skip
    sections, plots = [], []
    with_n = done.dropna(subset=["n_train"])
    for (family, other), group in with_n.groupby(["family", "others"], sort=False):
        if group.n_train.nunique() < 2:
            continue
        heading = f"{family}; {other}" if other else family
        table = train_size_table(
            group, metric, None if planned is None else planned.loc[(family, other)]
        )
        dash = (table.data == "-").to_numpy().any()
        texts = table.data.drop(columns=["n_train", "size"])  # the mechanisms' cells
        short = texts.map(lambda text: bool(SHORTFALL.search(text))).to_numpy().any()
        lead = Paragraph(
            f"{described}, mean [95% CI] (seeds), error bars the same interval; bold: "
            "the best mechanism per row"
            + (" among those whose every seed finished." if short else ".")
            + (
                " -: no cell of that mechanism finished at that n_train (not run, or "
                "see Cells not in the tables)."
                if dash
                else ""
            )
            + (
                " 'n=1 of 3': one of the three cells finished (the others: see Cells not in "
                "the tables); its mean is of the survivors."
                if short
                else ""
            )
        )
        section = Section(f"Training-set size: {heading}", [lead, table])
        plots.append(Plot(
            section,
            label_file_name("vs_train_size", str(heading)),
            f"{heading}: {metric} vs training-set size",
            partial(plot_vs_train_size, heading, group, colours, metric),
        ))  # fmt: skip
        sections.append(section)
    return sections, plots


def unfinished_section(cells: pd.DataFrame) -> Section:
    """ "Cells not in the tables": every cell of `cells` that is not done, with why
    (`cell_detail`); a setting column only where the cells have settings."""
    unfinished = cells[cells.status != "done"]
    if unfinished.empty:
        return Section(
            "Cells not in the tables", [Paragraph("None: every cell finished.")], details=True
        )
    columns = ["task", "size", "mechanism", "setting", "seed", "status"]
    if not unfinished.setting.astype(bool).any():  # no setting varies here: no column
        columns.remove("setting")
    data = unfinished[columns].astype(str)
    table = Table(data.assign(detail=unfinished.apply(cell_detail, axis=1)))
    return Section("Cells not in the tables", [table], details=True)
