"""Reports that cannot escape their folder, escape their text and are written whole: labels
differing only in punctuation get their own plots, no label writes outside the report folder,
report.md escapes HTML in labels and notes, a truncated checkpoint leaves a note instead of
failing, and an error mid-write leaves the previous report as it was. Real files throughout."""

import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

import ablations.report.sections
from ablations.grid.cell import Cell
from ablations.grid.cell_model import build_cell_model
from ablations.report.build import write_report
from ablations.report.pages import (
    Bullets,
    Image,
    Page,
    Paragraph,
    Section,
    Table,
    file_name,
    label_file_name,
    path_in,
    plot_text,
    render_html,
    render_markdown,
    short_label,
)
from ablations.results.store import ResultsStore
from ablations.run.train import attention_record
from ablations.tasks import build_task

ENVIRONMENT = {"torch": "9.9.9", "machine": "x86_64", "threads": 1}
IMAGE_LINK = re.compile(r"!\[(?:[^\]\\]|\\.)*\]\(([^)]+)\)")
SCRIPT = "<script>alert(1)</script>"


def config(task: str = "same_pair", mechanism: str = "standard", seed: int = 0, **more) -> dict:
    """A cell of a real task and mechanism, small enough to build a model of in milliseconds."""
    return {
        "grid": "safety",
        "task": task,
        "task_name": "same_pair",
        "task_kwargs": {"n_train": 64, "n_validation": 16, "n_test": 16},
        "size": {"label": "xs", "d_model": 16, "n_layers": 1},
        "mechanism": mechanism,
        "mechanism_name": "standard",
        "mechanism_kwargs": {"n_heads": 2},
        "training": {"steps": 40, "batch_size": 8, "early_stop_target": 0.9},
        "seed": seed,
    } | more


def add_done(store: ResultsStore, cell: dict, final: float) -> str:
    """Record `cell` done, its validation accuracy ramping up to `final`; its key."""
    curve = [[step, 1 - final, 1 - final, final * step / 40] for step in (10, 20, 30, 40)]
    metrics = {"steps": 40, "params": 1000, "step_ms": 1.0, "test_acc": final}
    key = store.claim(cell)
    store.finish(key, "done", metrics, curve, ENVIRONMENT)
    return key


def files_under(root: Path) -> dict[str, bytes | str]:
    """Every file and link under `root`, relative path: bytes (a link: 'link -> target')."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = f"link -> {path.readlink()}"
        elif path.is_file():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def section(markdown: str, heading: str) -> str:
    """The markdown under `heading` up to the next heading of level 2."""
    return markdown.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


def test_labels_differing_only_in_punctuation_get_their_own_plots(tmp_path):
    store = ResultsStore(tmp_path / "punct.sqlite")
    labels = {"pairs v64": 0.6, "pairs_v64": 0.9, "pairs-v64": 0.7, "Pairs v64": 0.8}
    for label, final in labels.items():
        add_done(store, config(task=label), final)
    out = write_report(store, tmp_path / "out")
    markdown = (out / "report.md").read_text()
    curves = {label: label_file_name("curves", label) for label in labels}
    assert len(set(curves.values())) == len(labels)  # the old names were all curves_pairs_v64
    assert curves["pairs v64"].startswith("curves_pairs-v64_")
    for label, name in curves.items():
        links = IMAGE_LINK.findall(section(markdown, f"## Task: {label}"))
        assert links == [name], label  # one parameter count: no accuracy-vs-parameters plot
        assert (out / name).is_file()
    pngs = [(out / name).read_bytes() for name in curves.values()]
    assert len(set(pngs)) == len(labels)  # each its own curves, not one drawn over another


def test_file_names_never_leave_the_folder(tmp_path):
    for label in ("../../x", "..", "/etc/passwd", "a/../../b", "a\\..\\b", "", "..\x00", "é"):
        name = label_file_name("curves", label)
        assert re.fullmatch(r"curves_([A-Za-z0-9_-]+_)?[0-9a-f]{8}\.png", name), name
        assert ".." not in name and path_in(tmp_path, name).parent == tmp_path.resolve()
    assert label_file_name("attention", ("a_b", "c")) != label_file_name("attention", ("a", "b_c"))
    for name in ("../x.png", "a/b.png", "..", ".", ""):
        with pytest.raises(ValueError):
            path_in(tmp_path, name)
    (tmp_path / "link.png").symlink_to(tmp_path.parent / "elsewhere.png")
    with pytest.raises(ValueError):
        path_in(tmp_path, "link.png")
    with pytest.raises(ValueError):  # a name the code chose must already be a plain one
        file_name("time", "../softmax")


def test_a_label_writes_nothing_outside_the_out_folder(tmp_path):
    store = ResultsStore(tmp_path / "store" / "escape.sqlite")
    evil = "../../x"
    for seed, final in enumerate((0.6, 0.8)):
        add_done(store, config(task=evil, mechanism=evil, seed=seed, grid="../../../victim"), final)
    victim = tmp_path / "victim.md"
    victim.write_text("precious")
    out = tmp_path / "a" / "b" / "out"
    out.mkdir(parents=True)  # a previous report whose files link out of the folder
    (out / "report.md").symlink_to(victim)
    (out / label_file_name("curves", evil)).symlink_to(tmp_path / "victim.png")
    before = files_under(tmp_path)
    write_report(store, out, title="../../../victim")
    after = files_under(tmp_path)

    def outside(files: dict) -> dict:  # but the store's own (SQLite's -wal and -shm files)
        return {k: v for k, v in files.items() if not k.startswith(("a/b/out/", "store/"))}

    assert outside(after) == outside(before)
    assert victim.read_text() == "precious" and not (tmp_path / "victim.png").exists()
    written = [p for p in out.rglob("*")]
    assert written and all(p.parent == out and p.is_file() and not p.is_symlink() for p in written)
    assert "x_" in "".join(p.name for p in written)  # the label's own files are in there


def test_markdown_escapes_labels_titles_and_notes(tmp_path):
    store = ResultsStore(tmp_path / "xss.sqlite")
    add_done(store, config(task=SCRIPT, mechanism="a|b\nc"), 0.8)
    note = "<script>alert(2)</script> but **bold** stays\n\n- and lists stay"
    out = write_report(store, tmp_path / "out", title="<b>Title</b> & more", note=note)
    markdown = (out / "report.md").read_text()
    assert "<script>" not in markdown and "<b>" not in markdown
    assert markdown.startswith("# &lt;b&gt;Title&lt;/b&gt; &amp; more\n")
    heading = "## Task: &lt;script&gt;alert(1)&lt;/script&gt;"
    assert heading in markdown  # the heading
    assert "![&lt;script&gt;alert(1)&lt;/script&gt;: learning curves](curves_" in markdown  # alt
    assert (
        "&lt;script&gt;alert(2)&lt;/script&gt; but **bold** stays\n\n- and lists stay" in markdown
    )
    row = [line for line in section(markdown, heading).splitlines() if "| xs |" in line]
    assert row and row[0].startswith("| xs | a\\|b c | 1 |")  # pipe escaped, newline flattened
    for link in IMAGE_LINK.findall(markdown):
        assert (out / link).is_file()
    page = (out / "index.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert "<strong>bold</strong> stays" in page and "<li>and lists stay</li>" in page
    assert "**" not in page  # the conclusion's markdown rendered, not shown as text


def test_a_notes_links_reach_only_the_reports_own_files(tmp_path):
    store = ResultsStore(tmp_path / "links.sqlite")
    add_done(store, config(), 0.8)
    note = (
        "[the summary](summary.csv), [away](http://evil.example/x), [up](../links.sqlite), "
        "[script](javascript:alert(1)), <http://evil.example/auto> and ![i](summary.csv)"
    )
    page = (write_report(store, tmp_path / "out", note=note) / "index.html").read_text()
    assert '<a href="summary.csv">the summary</a>' in page
    assert '!<a href="summary.csv">i</a>' in page  # no image: a link to the report's file
    assert page.count("<a ") == 2 and '<img src="summary.csv' not in page
    for shown in ("[away](http://evil.example/x)", "[up](../links.sqlite)",
                  "[script](javascript:alert(1))", "&lt;http://evil.example/auto&gt;"):  # fmt: skip
        assert shown in page


def test_every_text_of_the_page_model_is_escaped_on_both_pages(tmp_path):
    """Each place a text can take in a page, given HTML, a pipe, brackets, a backslash and a
    newline: report.md shows it on one line with & < > \\ | [ ] escaped, index.html
    autoescapes it; only the note keeps its lines (and its markdown)."""
    evil = "<i>x</i> & a|b [c] \\d\ne"
    one_line = "&lt;i&gt;x&lt;/i&gt; &amp; a\\|b \\[c\\] \\\\d e"
    (tmp_path / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    table = Table(pd.DataFrame({evil: [evil]}), pd.DataFrame({evil: [True]}))
    section = Section(evil, [Paragraph(evil), Bullets([evil]), table, Image("plot.png", evil)])
    details = Section(evil, [Paragraph(evil)], details=True)
    page = Page(evil, [evil], evil, evil, [details, section], question=evil)
    markdown = render_markdown(page)
    assert "<" not in markdown and ">" not in markdown.replace("&gt;", "")
    assert markdown.split("\n\n") == [
        f"# {one_line}",
        f"**Question:** {one_line}",
        f"- {one_line}",
        one_line,
        f"## {one_line}",  # the open section, then the note, then the details
        one_line,
        f"- {one_line}",
        f"| {one_line} |\n|---|\n| **{one_line}** |",
        f"![{one_line}](plot.png)",
        "&lt;i&gt;x&lt;/i&gt; &amp; a|b [c] \\d\ne",  # the note: its lines and markdown kept
        f"## {one_line}",
        f"{one_line}\n",
    ]
    page_html = render_html(page, tmp_path)
    assert "<i>" not in page_html and page_html.count("&lt;i&gt;x&lt;/i&gt; &amp; a|b") == 14
    with pytest.raises(ValueError):  # an image must be a file inside the folder
        render_html(Page("t", sections=[Section("s", [Image("../plot.png", "a")])]), tmp_path)


def test_a_right_to_left_override_in_a_label_is_shown_as_its_code(tmp_path):
    """U+202E in a label would show the rest of its line reversed (a hash suffix, the next
    cells): the pages, figures' texts and shortened labels show '<U+202E>' instead."""
    label = "std\u202eevil" + "x" * 60
    store = ResultsStore(tmp_path / "bidi.sqlite")
    add_done(store, config(mechanism=label), 0.8)
    out = write_report(store, tmp_path / "out", note="a note \u202e reversed")
    markdown, page = (out / "report.md").read_text(), (out / "index.html").read_text()
    for text in (markdown, page):
        assert "\u202e" not in text and "&lt;U+202E&gt;" in text
    shown = short_label(label, 20)
    assert "\u202e" not in shown and shown.startswith("std<U+202E>") and "…#" in shown
    assert "\u202e" not in plot_text(label)


def test_dollar_signs_in_labels_are_drawn_as_text(tmp_path):
    store = ResultsStore(tmp_path / "tex.sqlite")
    add_done(store, config(task="cost $\\foo$", mechanism="$\\bar$"), 0.8)
    out = write_report(store, tmp_path / "out")  # mathtext would fail on \foo
    assert (out / label_file_name("curves", "cost $\\foo$")).is_file()


def save_maps(store: ResultsStore, key: str, cell: dict, keep: float = 1.0) -> None:
    """A real attention record of `cell`'s model as its maps file, cut to `keep` of its bytes."""
    cell_ = Cell(**cell)
    task = build_task(cell_.task_name, **cell_.task_kwargs)
    record = attention_record(build_cell_model(cell_, task), task, task.splits(cell_.seed)["test"])
    buffer = io.BytesIO()
    torch.save(record, buffer)
    data = buffer.getvalue()
    store.maps_path(key).parent.mkdir(parents=True, exist_ok=True)
    store.maps_path(key).write_bytes(data[: int(len(data) * keep)])


def test_a_truncated_checkpoint_is_a_note_not_a_failure(tmp_path):
    store = ResultsStore(tmp_path / "ck.sqlite")
    cells = {name: config(mechanism=name) for name in ("whole", "truncated", "none")}
    keys = {name: add_done(store, cell, 0.8) for name, cell in cells.items()}
    save_maps(store, keys["whole"], cells["whole"])
    save_maps(store, keys["truncated"], cells["truncated"], keep=0.5)
    out = write_report(store, tmp_path / "out")
    markdown = (out / "report.md").read_text()
    maps = section(markdown, "## Attention maps")
    assert IMAGE_LINK.findall(maps) == [label_file_name("attention", ("same_pair", "xs", "whole"))]
    notes = [line for line in maps.splitlines() if line.startswith("- ")]
    assert len(notes) == 2
    (truncated,) = [n for n in notes if "/ truncated /" in n]
    assert truncated.startswith(
        f"- same_pair / xs / truncated / seed 0 (cell {keys['truncated'][:12]})"
    )
    assert "maps file cannot be loaded" in truncated
    (none,) = [n for n in notes if "/ none /" in n]
    assert "no checkpoint kept" in none


def test_an_error_mid_write_leaves_the_previous_report(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path / "store" / "whole.sqlite")
    for task, final in (("first", 0.6), ("second", 0.9)):
        add_done(store, config(task=task), final)
    reports = tmp_path / "reports"
    out = write_report(store, reports / "out")
    (out / "curves_stale.png").write_bytes(b"from an older report")  # listed as the report's:
    provenance = json.loads((out / "provenance.json").read_text())
    provenance["files"].append("curves_stale.png")
    (out / "provenance.json").write_text(json.dumps(provenance))
    before = files_under(reports)
    add_done(store, config(task="third"), 0.7)  # the next report's files would all differ
    plot_vs_params, calls = ablations.report.sections.plot_vs_params, []

    def fail_second(*args, **kwargs):  # the CSVs and the first task's plots written by then
        calls.append(args[0])
        if len(calls) == 2:
            raise RuntimeError("plotting failed")
        return plot_vs_params(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(ablations.report.sections, "plot_vs_params", fail_second)
        with pytest.raises(RuntimeError, match="plotting failed"):
            write_report(store, out)
    assert calls == ["first", "second"]
    assert files_under(reports) == before  # byte for byte
    assert [p.name for p in reports.iterdir()] == ["out"]  # no .partial (nor .old) folder

    write_report(store, out)  # a file the previous report wrote and this one does not: gone
    assert "curves_stale.png" not in {p.name for p in out.iterdir()}
    assert "## Task: third" in (out / "report.md").read_text()
    assert [p.name for p in reports.iterdir()] == ["out"]


def test_a_folder_that_is_not_a_report_is_never_replaced(tmp_path):
    store = ResultsStore(tmp_path / "store" / "guard.sqlite")
    add_done(store, config(), 0.8)
    mine = tmp_path / "mine"
    for extra in ("notes.txt", "data", None):
        folder = mine / str(extra)
        folder.mkdir(parents=True)
        if extra is None:  # no report.md: not a report
            (folder / "plot.png").write_bytes(b"mine")
        else:
            (folder / "report.md").write_text("my own notes")
            (folder / extra).mkdir() if extra == "data" else (folder / extra).write_text("x")
        before = files_under(mine)
        with pytest.raises(FileExistsError, match="not a previous report"):
            write_report(store, folder)
        assert files_under(mine) == before
    (mine / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        write_report(store, mine / "file")
