"""The report's answer to a grid's [selection]: the verdict table (the paired differences
with Holm-adjusted p-values, detectable effects and verdicts), and the Selection section of its
details (each mechanism at its best setting, its reported metrics, how the verdicts are made);
the statistics: ablations/report/selection.py; selection.csv and paired.csv."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pandas as pd

from ablations.grid.schema import Selection, higher_is_better
from ablations.report.figures import selected_axes
from ablations.report.folder import new_file
from ablations.report.pages import Paragraph, Part, Section, Table, write_csv
from ablations.report.selection import paired, select, verdicts
from ablations.report.tables import interval_text

PAIRED_CSV = ["task", "size", "others", "a", "b", "mean", "low", "high", "n", "sd", "p",
              "p_holm", "tost_p", "tost_p_holm", "detectable", "effect_of_interest", "verdict",
              "margin", "reported", "incomplete"]  # fmt: skip


def differing_note(task: str, settings: list[str]) -> Paragraph:
    """The note on `task`'s settings that differ between the mechanisms it compares
    (ablations.report.selection.differing_settings)."""
    return Paragraph(
        f"Not one setting: {task}'s mechanisms were trained with different settings that no "
        f"column shows (each mechanism's cells share them): {'; '.join(settings)}."
    )


class Selected(NamedTuple):
    """What `selection_section` gives the page: the `verdicts` (the paired differences' table
    and the paragraph above it: the page leads with them; none without pairs to compare), the
    details `section`, the `rows` of the cells at the chosen settings (their index) and `chosen`
    (`select`'s rows for the first reported metric: the headline figure's points). A verdict
    table of more than `LEAD_ROWS` rows is summarised per pair in `verdicts` (how many rows
    reach each verdict, the range of their detectable effects), so that the headline figure
    stays on the first screen, and shown whole in the details section `every`."""

    verdicts: list[Part]
    section: Section
    rows: set
    chosen: pd.DataFrame
    every: Section | None = None  # the verdict table row by row, where `verdicts` summarise it


def selection_section(cells: pd.DataFrame, selection: Selection, folder: Path) -> Selected:
    """Each mechanism at its best setting of `selection.over` (ablations.report.selection.select)
    per task, size and other axes, with each of its reported metrics; the paired differences
    `selection.compare` names, with their verdicts. Writes selection.csv and paired.csv (a
    `reported` column per metric's rows). ValueError naming a reported metric no cell has."""
    over = selected_axes(cells, selection)
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
        selection.effect_of_interest,
    )
    write_csv(
        pd.concat([c.assign(reported=name) for name, c in chosen.items()]).drop(
            columns=["seeds", "rows", "held"], errors="ignore"
        ),
        new_file(folder, "selection.csv"),
    )
    family = family.assign(margin=margin, effect_of_interest=selection.effect_of_interest)
    write_csv(family[PAIRED_CSV], new_file(folder, "paired.csv"))
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
            "best setting": [
                f"{best} (tied: {tied})" if tied else str(best)
                for best, tied in zip(first.best, first.tied, strict=True)
            ],
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
                interval_text(m, lo, hi, n)
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
        if first.edge.astype(bool).any():  # the best may lie beyond the values tried
            data["at the sweep's edge"] = first.edge
            parts.append(Paragraph(
                "At the sweep's edge: a chosen setting that is the highest or lowest value of "
                "its axis tried; the best setting may lie beyond it, so its mean is a bound, "
                "not the mechanism's best (widen the sweep to bracket it)."
            ))  # fmt: skip
        if first.tied.astype(bool).any():  # the choice among equals is the first tried
            parts.append(Paragraph(
                "Tied: other settings with the same mean; the first tried is shown, and it "
                "is no better than they are (no sweep's edge is flagged where a tied setting "
                "lies inside the sweep)."
            ))  # fmt: skip
        marks = pd.DataFrame(False, index=data.index, columns=data.columns)
        for column, best in bold.items():
            marks[column] = best.to_numpy()
        parts.append(Table(data, marks))
    verdict_parts: list[Part] = []
    if selection.compare:
        parts.append(
            Paragraph(_paired_method(family, reported, margin, selection.effect_of_interest))
        )
        head = family[family.reported == reported[0]].reset_index(drop=True)
        labels = {"task": head.task.astype(str), "size": head["size"].astype(str)}
        shared = {k: v.iloc[0] for k, v in labels.items() if len(v) and v.nunique() == 1}
        verdict_parts.append(Paragraph(
            f"Each row: a − b, each mechanism at its best setting, seed by seed: the mean "
            f"difference [95% interval] (n seeds both finished), its p-value Holm-adjusted "
            f"over the report's {int(family.p.notna().sum())} tests, the smallest difference "
            "the design detects with 80% power, and the verdict at 5% family-wise error"
            + "".join(f"; every row's {k}: {v}" for k, v in shared.items())
            + ". How: Selection: each mechanism at its best setting (below); data: paired.csv."
        ))  # fmt: skip
        table = pd.DataFrame({
            **{k: v for k, v in labels.items() if k not in shared},  # a column where they differ
            **({"other axes": head.others} if head.others.astype(bool).any() else {}),
            "a − b": [f"{a} − {b}" for a, b in zip(head.a, head.b, strict=True)],
        })  # fmt: skip
        for name in reported:
            pair = family[family.reported == name].reset_index(drop=True)
            prefix = f"{name} " if len(reported) > 1 else ""
            table[f"{name} difference [95% CI]"] = [
                interval_text(m, lo, hi, n, signed=True)
                for m, lo, hi, n in zip(pair["mean"], pair.low, pair.high, pair.n, strict=True)
            ]
            table[f"{prefix}p Holm"] = pair.p_holm.map(_p_text)
            table[f"{prefix}detectable (80% power)"] = pair.detectable.map(
                lambda d: "-" if pd.isna(d) else f"±{d:.3g}"
            )
            if margin is not None:
                table[f"{prefix}TOST p Holm"] = pair.tost_p_holm.map(_p_text)
            table[f"{prefix}verdict"] = pair.verdict
        if head.why.astype(bool).any():  # a '-' says why
            table["why"] = head.why
        verdict_parts.append(Table(table))
    rows = {i for found in first.get("rows", pd.Series(dtype=object)).dropna() for i in found}
    section = Section("Selection: each mechanism at its best setting", parts, details=True)
    if len(verdict_parts) < 2 or len(verdict_parts[1].data) <= LEAD_ROWS:
        return Selected(verdict_parts, section, rows, first)
    every = Section(f"Every comparison ({len(head)} rows)", verdict_parts, details=True)
    summary = [
        Paragraph(
            f"The {len(head)} comparisons, by pair: how many reach each verdict, and the range "
            "of the smallest difference the design detects with 80% power (a − b, each "
            f"mechanism at its best setting, seed by seed; p Holm-adjusted over the report's "
            f"{int(family.p.notna().sum())} tests). Each row, with its difference, interval "
            f"and p: {every.heading}, below."
        ),
        Table(_verdict_counts(family, reported)),
    ]
    return Selected(summary, section, rows, first, every)


LEAD_ROWS = 12  # the most rows of the verdict table the page leads with; more are summarised


def _verdict_counts(family: pd.DataFrame, reported: list[str]) -> pd.DataFrame:
    """Per pair (a − b) of `family` (`verdicts`' rows): the comparisons, and per metric of
    `reported` the count of each verdict and the range of the detectable effects."""
    rows = []
    for (a, b), pairs in family.groupby(["a", "b"], sort=False):
        row = {"a − b": f"{a} − {b}"}
        for name in reported:
            pair = pairs[pairs.reported == name]
            prefix = f"{name} " if len(reported) > 1 else ""
            row.setdefault("comparisons", str(len(pair)))
            verdicts = pair.verdict.str.split(" (", regex=False).str[0]  # without the detail
            counts = verdicts.value_counts(sort=False)
            row[f"{prefix}verdicts"] = "; ".join(f"{n} {verdict}" for verdict, n in counts.items())
            low, high = pair.detectable.min(), pair.detectable.max()
            span = f"±{low:.3g}" if low == high else f"±{low:.3g} to ±{high:.3g}"
            row[f"{prefix}detectable (80% power)"] = "-" if pd.isna(low) else span
        rows.append(row)
    return pd.DataFrame(rows)


def _p_text(p: float) -> str:
    """A p-value as shown: '0.012', '<0.001'; '-' for none."""
    return "-" if pd.isna(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def _paired_method(
    family: pd.DataFrame, reported: list[str], margin: float | None, effect: float | None
) -> str:
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
        f"still be no clear difference. {equivalence} Detectable (80% power): the smallest "
        "true difference this design finds with an 80% chance, by the paired t test at "
        f"0.05/{size} (Holm's strictest level) with the spread of these differences "
        "(noncentral t); a difference smaller than it can go unseen. "
        + (f"The grid's selection.effect_of_interest is ±{effect:g}: where the detectable "
           "effect is larger, the comparison reads 'underpowered', not 'no clear difference'. "
           if effect is not None else
           "The grid sets no selection.effect_of_interest (the difference that matters). ")
        + "'No clear difference' is not evidence of no difference. Data: paired.csv."
    )  # fmt: skip
