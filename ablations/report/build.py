"""Reports of a grid's results store: tables, plots, markdown and a self-contained HTML page.

`write_report(store, out_dir)` writes, under stable names:

    report.md            markdown for a code host: tables, links to the PNGs beside it
    index.html           one self-contained page: the same, PNGs embedded as base64 data URIs
    summary.csv          the main table, one row per (task, size, mechanism)
    cells.csv            one row per cell, config, metrics and environment flattened to dotted
                         columns (results/cells_file.py reads it back: a report rebuilt from it)
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
                         checkpoints (report/attention_maps.py; writing a report runs no model)
    headline.png         with a [selection]: the reported metric of each mechanism at its
                         selected setting against the grid's main axis, 95% band, and the
                         reference curves of the grid's [report] dashed (report/headline.py)

The page leads with the answer: the question (the grid's [report], else read from the
[selection]), the verdict table and the headline figure, then the note (the conclusion), then the
details (every setting, learning curves, provenance, the cells not in the tables: collapsed in
index.html; without a selection, the tables are the answer and stay open).

(with a grid's [selection]: the curves and vs_params plots draw each mechanism's selected
setting only, the curves one plot per setting of the axes not chosen over, named
"<task>; <axes>"; the tables keep every setting), where <task>, <family> and <cell> are
`label_file_name`'s slug and hash of the label (e.g. ``curves_pairs-v64_3fa2c1d0.png``): two
labels never share a file, and no label can name a file outside the folder. Labels and notes
are shown as text on both pages (see ablations.report.pages); a missing or unreadable maps file
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

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from ablations.grid.schema import ReportSettings, Selection
from ablations.report.attention_maps import attention_sections, carried_attention_sections
from ablations.report.folder import (
    carry_over,
    check_replaceable,
    hidden_sibling,
    new_file,
    record_files,
    recover,
    replace_folder,
)
from ablations.report.headline import (
    RecordedReport,
    question_text,
    recorded_report,
    report_record,
)
from ablations.report.pages import (
    Bullets,
    Image,
    Page,
    Paragraph,
    Section,
    label_colours,
    write_csv,
    write_pages,
)
from ablations.report.provenance import (
    RERUNS,
    carried_reruns,
    code_line,
    code_versions,
    data_line,
    non_finite_metrics,
    provenance_record,
    reruns_fact,
    unclean_code,
    unclean_data,
)
from ablations.report.sections import (
    headline_section,
    task_sections,
    train_size_sections,
    unfinished_section,
)
from ablations.report.selection import axis_columns, differing_settings, repeated_seed
from ablations.report.selection_section import differing_note, selection_section
from ablations.report.tables import (
    NO_CURVES,
    cells_csv,
    summary_table,
    task_family,
    tidy_cells,
    with_cells_not_run,
)
from ablations.results.axes import CellSource, GridAxes, swept_of
from ablations.results.cells_file import CellsFile
from ablations.results.frames import cells_table
from ablations.results.store import ResultsStore
from ablations.run.reproduce import reruns_lock
from ablations.steps import Steps

INTRO = (
    "Test accuracy: mean [95% confidence interval] over the seeds that finished (Student's t, "
    "unclipped: with few seeds a bound can pass 1; seeds: finished, of all; no interval for "
    "one seed). "
    "Steps to target: the first evaluated step whose validation accuracy reaches the "
    "target, mean over the seeds that reached it (reached/finished); samples = steps × "
    "batch size. Bold: best in the task (of the rows whose every seed finished, the highest "
    "accuracy and the fewest steps and samples among those where most seeds reached the "
    "target; fewest parameters; lowest "
    "ms/step among the timings not marked contended: cells timed while more workers x "
    "threads than cores ran). Learning curves: mean line and min-max band over seeds (a seed that "
    "stopped early holds its last value). Data: summary.csv, cells.csv (every cell: "
    "config, metrics, environment) and curves.csv (every evaluated step); provenance.json: "
    "the source, the grid file's SHA-256 and the environments. `attn-zoo report "
    "<folder>/cells.csv --grid <grid> --out <folder>` rebuilds this report from them."
)
PROVENANCE = "Provenance and how to read the tables"


def _provenance_section(grids: list[str], cells: pd.DataFrame, provenance: dict) -> Section:
    """The details section of what the report was built from: the facts (grid names and the
    report's source, the grid file and its SHA-256, cells by status, code, environment, date:
    `provenance`) and how to read the tables."""
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
    code = "; ".join(f"{n} cells at {version}" for version, n in provenance["code"].items())
    facts += [
        f"Cells: {len(cells)} ({statuses})",
        f"Code: {code or 'no cell ran'}",
        f"Environment: {'; '.join(provenance['environment']) or 'not recorded'}",
        f"Generated: {provenance['generated']}",
    ]
    if not provenance["curves"]:
        facts.append(f"Learning curves and steps to target: left out ({NO_CURVES})")
    return Section(PROVENANCE, [Bullets(facts), Paragraph(INTRO)], details=True)


def write_report(
    store: str | Path | CellSource,
    out_dir: str | Path,
    title: str | None = None,
    target: float | None = None,
    note: str | None = None,
    selection: Selection | None = None,
    keys: set[str] | Mapping[str, dict] | None = None,
    progress: Steps | None = None,
    grid: str | Path | None = None,
    overrides: Sequence[str] = (),
    require_clean: bool = False,
    report: ReportSettings | None = None,
) -> Path:
    """Write the report of `store` (a ResultsStore or the path of its SQLite file; or a report's
    cells.csv, ablations.results.cells_file) into the folder `out_dir`: report.md, index.html,
    summary.csv, cells.csv, curves.csv, provenance.json and the PNG plots, with attention maps of
    the cells that kept checkpoints (and attention.json, their blocks). `grid` (the grid file's
    path, and its --set `overrides`) is named with its SHA-256 in the header and provenance.json. A
    report from a cells.csv draws no attention maps but carries over those of the report beside the
    cells.csv (its attention.json and PNG files), and without a curves.csv beside it has no learning
    curves and no steps to target (one line of the header says so). `target` is the validation
    accuracy for steps-to-target (default: the cells' training.early_stop_target when nonzero);
    `note` a paragraph shown under the header (e.g. the conclusion), the one text whose markdown
    report.md keeps (raw HTML in it is escaped, see ablations.report.pages); `selection` (a grid's
    [selection]; default: the one the runs of the cells' grid recorded, ablations/results/axes.py)
    adds the section comparing each mechanism at its best setting (ablations.report.selection) and
    writes selection.csv and paired.csv; `keys` limits the report to those cells (a grid's: the
    store's other cells, e.g. of an earlier version of the grid, are left out and counted in the
    header); given as {key: config}, the grid's cells the store does not hold are counted and listed
    as not run, and no selection takes a setting that lacks one. `progress` (ablations.steps) counts
    the steps: the tables, each plot and attention map, and the pages. `require_clean` refuses
    (ValueError) cells that did not all run from one clean commit, or cells of one task that
    read other versions of one data file (ablations.report.provenance.unclean_code,
    unclean_data), naming them; without it the header names those data versions. `report`:
    the grid file's [report] (its question and reference curves, files relative to `grid`;
    default: as the provenance.json beside a cells.csv records them,
    ablations/report/headline.py). Returns `out_dir`.

    The page leads with the answer: the question, the verdict table and the headline figure
    (with a [selection]), the note; then the details (every setting, the learning curves,
    provenance, the cells not in the tables), collapsed in index.html.

    The folder is written whole or not at all: the report is written into a new hidden sibling
    folder (``.<name>.partial-<pid>-<random>``), which then replaces `out_dir`
    (`replace_folder`: swapped in one step where the file system can), so the previous report's
    files (those its provenance.json lists under "files") that this report does not write are
    deleted with it, while every other entry of `out_dir` (the user's) is carried over
    untouched (ablations/report/folder.py); an error on the way leaves the previous report as it
    was and no partial folder behind, and a kill at any instant leaves the old or the new report;
    the next report into `out_dir` deletes what killed reports left (`recover`).
    To keep other files safe, `out_dir` must be missing, empty, or a previous report: a folder
    holding report.md and, for a report that recorded no files, only .md, .html, .csv, .png and
    .json files, all replaced (FileExistsError otherwise).
    A cells.csv inside `out_dir` is read whole before the folder is replaced. The report keeps
    every row of the reproduce.csv in `out_dir` and of the one beside a cells.csv it is built
    from (ablations.report.provenance.carried_reruns: a rebuild loses neither's reruns; a file
    of that name that is not one is refused, ValueError, before anything is written); they are
    read, and the folder replaced, under the lock `attn-zoo reproduce` merges its rows under
    (ablations.run.reproduce.reruns_lock), so that no rerun it writes meanwhile is lost."""
    store = open_store(store)
    recorded = lead_record(store, report, grid)  # before anything is written: its files read,
    if require_clean:  # the cells checked
        rows = [row for row in store.rows() if keys is None or row["key"] in keys]
        problems = list(filter(None, [unclean_code(rows), unclean_data(rows)]))
        if problems:
            raise ValueError(f"--require-clean: {'; '.join(problems)}")
    final = Path(out_dir).resolve()
    recover(final)
    check_replaceable(final)  # refused now, not after the plots; read again before the swap
    carried_reruns(store, final)  # a reproduce.csv that is not one too; read again to merge
    final.parent.mkdir(parents=True, exist_ok=True)
    partial_dir = hidden_sibling(final, "partial")
    partial_dir.mkdir()
    try:
        progress = progress or Steps()
        progress.expect(1)  # the pages, after report_page's steps
        page = report_page(
            store, partial_dir, title, target, note, selection, keys, progress, grid, overrides,
            recorded,
        )  # fmt: skip
        progress.doing("pages: report.md, index.html")
        with reruns_lock(final):  # no `attn-zoo reproduce` writes reproduce.csv until the swap
            reruns = carried_reruns(store, final)
            if reruns is not None:  # `attn-zoo reproduce`'s comparison is kept, and named
                reruns.to_csv(new_file(partial_dir, RERUNS), index=False)
                page.facts.append(reruns_fact(reruns))  # in the header, under the code line
            write_pages(page, partial_dir)
            record_files(partial_dir)
            others = check_replaceable(final)  # not the previous report's: the user's own
            carry_over([name for name in others if name != RERUNS], final, partial_dir)
            replace_folder(partial_dir, final)
        progress.advance()
    finally:
        shutil.rmtree(partial_dir, ignore_errors=True)  # gone already unless something failed
    return Path(out_dir)


def open_store(store: str | Path | CellSource) -> CellSource:
    """`store`, or the ResultsStore at that path opened read-only (a .csv path: its
    CellsFile): a report creates and changes nothing beside its folder (FileNotFoundError
    without a store, StoreError for a file that is not one)."""
    if not isinstance(store, str | Path):
        return store
    if Path(store).suffix == ".csv":
        return CellsFile(store)
    if not Path(store).is_file():
        raise FileNotFoundError(f"no results store at {store}")
    return ResultsStore(store, readonly=True)


def lead_record(
    store: CellSource, report: ReportSettings | None, grid: str | Path | None
) -> RecordedReport | None:
    """The [report] a report leads with: the grid file's `report` with its reference curve
    files read (ValueError without the `grid` file they are relative to), else the one the
    provenance.json beside a cells.csv records, else none."""
    if report is not None:
        if grid is None:
            raise ValueError("a grid's [report] needs its grid file: its curve files lie there")
        return report_record(report, Path(grid))
    if isinstance(store, CellsFile):
        return recorded_report(store.path.with_name("provenance.json"))
    return None


def recorded_selection(axes: dict[str, GridAxes], grids: list[str]) -> Selection | None:
    """The [selection] the runs of every grid of `grids` recorded (results/axes.py), where they
    recorded one and the same; None otherwise (no selection section)."""
    tables = [axes[name].selection for name in grids if name in axes]
    if len(tables) != len(grids) or not tables or tables[0] is None:
        return None
    return Selection.model_validate(tables[0]) if tables.count(tables[0]) == len(tables) else None


def report_page(
    store: str | Path | CellSource,
    folder: str | Path,
    title: str | None = None,
    target: float | None = None,
    note: str | None = None,
    selection: Selection | None = None,
    keys: set[str] | Mapping[str, dict] | None = None,
    progress: Steps | None = None,
    grid: str | Path | None = None,
    overrides: Sequence[str] = (),
    recorded: RecordedReport | None = None,
) -> Page:
    """Write the report's data and plots (summary.csv, cells.csv, curves.csv, provenance.json,
    the PNGs) into the empty `folder` and return its page (the model report.md and index.html
    are rendered from, see `report_pages.write_pages`); the arguments are `write_report`'s,
    `recorded` its [report] (`lead_record`).
    The plots are planned first and drawn last, so that `progress` knows their number before
    the first is drawn."""
    store, folder = open_store(store), Path(folder)
    records, left_out = list(store.rows()), 0
    if keys is not None:
        mine = [record for record in records if record["key"] in keys]
        left_out, records = len(records) - len(mine), with_cells_not_run(mine, keys)
    configs = [record["config"] for record in records]  # as stored (the frame's are flat)
    frame, curves = cells_table(records), store.curves()
    non_finite = non_finite_metrics(store)
    frame["non_finite"] = [non_finite.get(key, "") for key in frame.key]
    grids = list(dict.fromkeys(frame.get("grid", pd.Series()).dropna()))
    axes = {name: kept for name, kept in store.axes().items() if name in grids}
    swept = swept_of(axes, grids)  # None: a store older than the record; the axes then vary
    if selection is None:  # the report of a store or cells.csv alone: as its grids' runs chose
        selection = recorded_selection(axes, grids)
    environments = [record.get("environment") for record in records]
    cells = tidy_cells(frame, swept, environments)
    repeated = repeated_seed(cells)
    if repeated:  # e.g. a grid and a renamed copy of it run into one store
        raise ValueError(
            f"two cells of one seed ({repeated}) among the cells of grid"
            f"{'s' * (len(grids) > 1)} {', '.join(grids) or '-'}: each would count as a seed; "
            "report one grid: `attn-zoo report GRID.toml`"
        )
    cells = cells.assign(family=[task_family(config) for config in configs])
    summary = summary_table(cells, curves, target)

    progress = progress or Steps()
    progress.expect(1)  # the tables: cells, summary, and selection
    progress.doing("tables")
    write_csv(cells_csv(frame, records), new_file(folder, "cells.csv"))
    if curves is not None:  # the report's cells' only
        write_csv(curves[curves.key.isin(frame.key)], new_file(folder, "curves.csv"))
    write_csv(summary, new_file(folder, "summary.csv"))
    provenance = provenance_record(
        store, curves, grid, overrides, axes, code_versions(records), recorded
    )
    text = json.dumps(provenance, indent=2, ensure_ascii=False) + "\n"
    new_file(folder, "provenance.json").write_text(text, encoding="utf-8")
    title = title or "Ablation report: " + (", ".join(sorted(grids)) or "empty store")
    page = Page(title, note=note or None, question=question_text(recorded, selection))
    page.facts.append(code_line(provenance["code"], recorded and recorded.unclean))
    page.facts.extend(filter(None, [data_line(records)]))  # data files read in two versions
    about = _provenance_section(sorted(grids), cells, provenance)
    facts = about.parts[0].items
    if left_out:
        facts.insert(2, f"Left out: {left_out} cells of the store that are not in the grid")
    unswept = [key for key in axis_columns(cells) if swept is not None and key not in swept]
    if unswept:  # kept apart all the same: their cells are no seeds of one setting
        facts.append(
            f"Not swept by the grid, yet varying among its cells (shown as axes): "
            f"{', '.join(unswept)} (cells of an earlier version of the grid?)"
        )

    differing = differing_settings(frame)  # e.g. a mechanism with its own learning rate
    colours = label_colours(cells.mechanism.dropna())
    done = cells[cells.status == "done"]
    chosen_keys = None  # the cells of each mechanism's selected setting: their maps are shown
    plotted, metric = done, "test_acc"  # the cells the task plots draw, the metric they show
    plots, answer = [], None
    if selection is not None:
        selected = selection_section(cells, selection, folder)
        section = selected.section
        section.parts[1:1] = [differing_note(task, keys) for task, keys in differing.items()]
        chosen_keys = set(frame.loc[sorted(selected.rows), "key"])
        plotted, metric = done.loc[done.index.isin(selected.rows)], selection.reported_metrics[0]
        answer = headline_section(selected, metric, colours, recorded)
        page.sections += [answer.section, *filter(None, [selected.every]), section]
        plots.append(answer)
    tasks, task_plots = task_sections(
        summary, plotted, configs, curves, colours, selection, metric, differing
    )
    sizes, size_plots = train_size_sections(cells, plotted, selection, metric, colours)
    page.sections += tasks + sizes
    plots += task_plots + size_plots

    progress.expect(len(plots))
    progress.advance()  # the tables
    for section, name, alt, draw in plots:  # one figure at a time in memory
        progress.doing(f"plot {name}")
        figure = draw()
        if figure is not None:
            figure.savefig(new_file(folder, name), dpi=100)
            section.parts.append(Image(name, alt))
        progress.advance()

    if store.draws_maps:  # the maps files lie beside the store
        page.sections.extend(attention_sections(store, folder, keys, chosen_keys, progress))
    elif store.attention is not None:  # a cells.csv: the maps of the report beside it
        page.sections.extend(carried_attention_sections(store.attention, folder))
    page.sections += [about, unfinished_section(cells)]
    if answer is not None:  # the answer leads, the rest are its details (without: the tables
        for section in page.sections:  # are the answer, shown open)
            section.details = section is not answer.section
    return page
