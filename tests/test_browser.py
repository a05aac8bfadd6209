"""A report as a reader's browser shows it (headless Chromium, tests/browser.py): every image
loads, nothing is requested from the network, no console error, no JavaScript dialog, and
labels written as HTML or Markdown are shown as the literal text they are. Slow (Chromium
starts in a second or two); skipped where Chromium is not installed (`make browser-deps`)."""

from __future__ import annotations

import html

import pytest
from browser import CHROMIUM, open_page
from test_report_safety import add_done, config

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
    assert len(page.images) >= 4
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
