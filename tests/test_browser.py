"""A report as a reader's browser shows it (headless Chromium, tests/browser.py): every image
loads, nothing is requested from the network, no console error, no JavaScript dialog, and
labels written as HTML or Markdown are shown as the literal text they are; a report with a
[selection] (each committed one, rebuilt from its cells.csv, among them) shows its question,
verdict table and headline figure first, 1280 px wide, the details collapsed below, and no
markdown syntax. Slow (Chromium starts in a second or two; the committed reports take minutes
to rebuild); skipped where Chromium is not installed (`make browser-deps`)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
from browser import CHROMIUM, open_page
from test_report_lead import QUESTION, REFERENCE, sweep_store
from test_report_safety import add_done, config

from ablations.cli import main
from ablations.grid.schema import ReferenceCurve, ReportSettings
from ablations.grid.spec import load_grid
from ablations.report.build import write_report
from ablations.results.store import ResultsStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (make browser-deps)"),
]

IMG = "<img src=x onerror=alert(1)>"
MARKDOWN_IMAGE = "![x](http://evil.example/t.png)"
SCRIPT = "<script>alert(2)</script>"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """index.html of a report whose task and mechanism labels are HTML and Markdown."""
    folder = tmp_path_factory.mktemp("browser")
    store = ResultsStore(folder / "hostile.sqlite")
    for task in ("same_pair", IMG):
        for i, mechanism in enumerate(["standard", IMG, MARKDOWN_IMAGE, SCRIPT]):
            for seed in (0, 1):
                cell = config(task=task, mechanism=mechanism, seed=seed)
                add_done(store, cell, 0.6 + i / 20 + seed / 100)
    return write_report(store, folder / "out") / "index.html"


def test_a_report_loads_whole_and_shows_hostile_labels_as_text(report):
    page = open_page(report)
    assert page.errors == []
    assert page.dialogs == []
    assert len(page.images) == 2  # each task's learning curves (one parameter count: no more)
    for image in page.images:  # every plot decoded, none broken
        assert image["complete"] and image["width"] > 0, image
    assert {url.split(":", 1)[0] for url in page.requests} == {"file", "data"}
    for label in (IMG, MARKDOWN_IMAGE, SCRIPT):
        assert label in page.text  # shown as written
    assert f"Task: {IMG}" in page.text


def test_the_browser_check_catches_a_label_written_into_the_page_as_html(report, tmp_path):
    """The same report with the labels unescaped, as a template without autoescape would
    write them: the alert, the broken image and the request to another host are all seen."""
    page = report.read_text()
    assert html.escape(IMG, quote=False) in page
    page = page.replace(html.escape(IMG, quote=False), IMG).replace(
        html.escape(SCRIPT, quote=False), SCRIPT
    )
    page = page.replace(MARKDOWN_IMAGE, '<img src="http://evil.example/t.png">')
    broken = tmp_path / "index.html"
    broken.write_text(page)
    seen = open_page(broken)
    assert "1" in seen.dialogs and "2" in seen.dialogs
    assert [image for image in seen.images if image["width"] == 0]
    assert "http://evil.example/t.png" in seen.requests
    assert seen.errors  # the images that failed to load
    assert IMG not in seen.text


WIDTH, HEIGHT = 1280, 800  # CSS pixels: a laptop's window
MARKDOWN_SYNTAX = ("**", "\\_", "\\[", "](", "| --- |", "## ")  # shown only if left unrendered


def assert_leads_with_the_answer(page, question: str, verdicts: bool = True) -> None:
    """`page` (tests/browser.py) shows `question`, the verdict table (its detectable effects;
    none without `verdicts`: a selection comparing no pair) and the headline figure, in that
    order, above the first <details>; every image loads; no error, no markdown syntax shown as
    text."""
    assert page.errors == [] and page.dialogs == []
    for image in page.images:
        assert image["complete"] and image["width"] > 0, image
    assert page.question is not None and question in page.question["text"]
    first_details = min(d["top"] for d in page.details)
    tables = [t for t in page.tables if not t["in_details"]]
    [headline] = [i for i in page.images if not i["in_details"]]
    assert "headline figure" in headline["alt"]
    assert len(tables) == verdicts and headline["bottom"] <= first_details
    for table in tables:
        assert "detectable (80% power)" in table["header"] and "verdict" in table["header"]
        assert page.question["bottom"] <= table["top"] < table["bottom"] <= headline["top"]
    for syntax in MARKDOWN_SYNTAX:
        assert syntax not in page.text, syntax


def test_a_report_with_a_selection_opens_with_its_answer_first(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text("")
    (tmp_path / "ref.csv").write_text(REFERENCE)
    curve = ReferenceCurve(file="ref.csv", label="paper", source="Doe 2024", column="acc")
    out = write_report(
        sweep_store(tmp_path / "s.sqlite").path, tmp_path / "out", grid=grid,
        note="**Conclusion**: dual _is_ ahead, see [the pairs](paired.csv).",
        report=ReportSettings(question=QUESTION, reference_curves=[curve]),
    )  # fmt: skip
    page = open_page(out / "index.html", width=WIDTH)
    assert_leads_with_the_answer(page, QUESTION)
    assert "Conclusion: dual is ahead, see the pairs." in page.text  # rendered, not as text
    assert [d["summary"] for d in page.details] == [
        "Selection: each mechanism at its best setting", "Task: same_pair",
        "Training-set size: same_pair", "Provenance and how to read the tables",
        "Cells not in the tables",
    ]  # fmt: skip


def committed_reports() -> list[Path]:
    """The committed reports whose grid file (as their provenance.json names it) has a
    [selection]."""
    found = []
    for provenance in sorted(Path("reports").glob("*/provenance.json")):
        grid = json.loads(provenance.read_text()).get("grid_file")
        if grid and Path(grid).is_file() and "\n[selection]" in Path(grid).read_text():
            found.append(provenance.parent)
    return found


@pytest.mark.parametrize("committed", committed_reports(), ids=lambda path: path.name)
def test_every_committed_report_rebuilt_opens_with_its_answer_first(committed, tmp_path):
    grid = Path(json.loads((committed / "provenance.json").read_text())["grid_file"])
    conclusion = grid.with_suffix(".conclusion.md")
    note = ["--note", conclusion.read_text()] if conclusion.is_file() else []
    out = tmp_path / committed.name
    main(["report", str(committed / "cells.csv"), "--grid", str(grid), "--out", str(out), *note])
    page = open_page(out / "index.html", width=WIDTH, height=HEIGHT)
    spec = load_grid(grid, check_device=False)
    question = spec.file.report.question or ("Does " if spec.selection.compare else "Which ")
    assert_leads_with_the_answer(page, question, verdicts=bool(spec.selection.compare))
    [headline] = [i for i in page.images if not i["in_details"]]
    assert headline["top"] < HEIGHT, f"the headline figure starts {headline['top']} px down"
