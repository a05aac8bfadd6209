"""What a report leads with: the question it answers and the reference curves of its headline
figure (ablations/report/figures.py, `plot_headline`), from the grid's [report] table.

A report of a grid file reads its [report] (ablations/grid/schema.py, `ReportSettings`) and
each reference curve file (a CSV, path relative to the grid file's folder) at once, before
anything is written, and records both in its provenance.json under "report" (`RecordedReport`:
the settings and every row of each file), so that a report rebuilt from its cells.csv alone
(`attn-zoo report <folder>/cells.csv`) leads with the same question and curves, needing
neither the grid file nor the curve files; with --grid, that grid's [report] is read instead.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from ablations.grid.schema import REFERENCE_CSV, ReferenceCurve, ReportSettings, Selection


class RecordedCurve(ReferenceCurve):
    """A reference curve as a report records it: its [report] entry and the file's `rows`
    ({column: value}, comment lines left out)."""

    rows: list[dict[str, Any]]


class RecordedReport(ReportSettings):
    """A grid's [report] as a report records it in provenance.json: its question and its
    reference curves with their files' rows."""

    reference_curves: list[RecordedCurve] = []


def read_reference(curve: ReferenceCurve, grid: Path) -> RecordedCurve:
    """The reference curve file of `curve` (relative to the grid file `grid`'s folder) read:
    its rows but for lines starting with '#'; ValueError naming the file where it cannot be
    read or lacks the columns task and model."""
    path = grid.parent / curve.file
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        rows = pd.read_csv(io.StringIO("".join(line for line in lines if not line.startswith("#"))))
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"[report] reference_curves file {path}: cannot read it ({err})") from None
    if not {"task", "model"} <= set(rows.columns):
        raise ValueError(
            f"[report] reference_curves file {path} has the columns "
            f"{', '.join(map(str, rows.columns))}; valid: {REFERENCE_CSV}"
        )
    records = rows.astype(object).where(rows.notna(), None).to_dict("records")
    return RecordedCurve(**curve.model_dump(), rows=records)


def report_record(settings: ReportSettings, grid: Path) -> RecordedReport:
    """The grid file `grid`'s [report] `settings` with each reference curve file read."""
    curves = [read_reference(curve, grid) for curve in settings.reference_curves]
    return RecordedReport(
        question=settings.question, unclean=settings.unclean, reference_curves=curves
    )


def recorded_report(provenance: Path) -> RecordedReport | None:
    """The [report] a report's provenance.json at `provenance` records (None without the file,
    or a report built before it was recorded); ValueError naming the file for anything else."""
    if not provenance.is_file():
        return None
    try:
        data = json.loads(provenance.read_text(encoding="utf-8"))
        recorded = data.get("report") if isinstance(data, dict) else None
        return None if recorded is None else RecordedReport.model_validate(recorded)
    except (ValueError, ValidationError) as err:  # a JSONDecodeError is a ValueError
        raise ValueError(f"{provenance} holds no report's [report]: {err}") from None


def question_text(recorded: RecordedReport | None, selection: Selection | None) -> str | None:
    """The question a report leads with: the grid's [report] question, else one read from
    its `selection` (e.g. "Does test_acc differ between dual and standard, each mechanism
    at its best training.lr (chosen on val_acc), per task, size and other axes?"); None
    without either."""
    if recorded is not None and recorded.question is not None:
        return recorded.question
    if selection is None:
        return None
    metrics = " and ".join(selection.reported_metrics)
    best = (f"each mechanism at its best {', '.join(selection.over) or 'setting'} (chosen on "
            f"{selection.metric}), per task, size and other axes")  # fmt: skip
    if not selection.compare:
        return f"Which mechanism has the best {metrics}, {best}?"
    pairs = "; ".join(f"{a} and {b}" for a, b in selection.compare)
    return f"Does {metrics} differ between {pairs}, {best}?"
