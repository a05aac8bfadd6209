"""Reports and status under hostile inputs, each as it failed: a database that is not a results
store, a read-only mount, a SIGKILL in the report's folder swap, NaN results, cells compared with
different settings, swept values that print alike, and labels that are links, formulas or very
long. Real files, mounts, processes and signals throughout."""

from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from grids import STD, tiny_grid
from test_report_safety import add_done, config, files_under
from test_report_safety import section as section_of

from ablations.cli import main
from ablations.report.build import recover, write_report
from ablations.results.store import ResultsStore

REPO = Path(__file__).resolve().parents[1]
WHOLE = ("report.md", "index.html", "summary.csv", "cells.csv")  # what every report holds


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m ablations.cli ARGS` in a process of its own."""
    command = [sys.executable, "-m", "ablations.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def whole_report(folder: Path) -> str:
    """report.md of the complete report in `folder` (every file there, index.html ended)."""
    assert {name for name in WHOLE} <= {p.name for p in folder.iterdir()}
    assert (folder / "index.html").read_text().endswith("</html>\n")
    return (folder / "report.md").read_text()


# Read means read --------------------------------------------------------------------------


def test_report_refuses_a_database_that_is_not_a_results_store_and_changes_nothing(tmp_path):
    notes = tmp_path / "notes.sqlite"
    with sqlite3.connect(notes) as db:
        db.execute("CREATE TABLE notes (day TEXT, text TEXT)")
        db.execute("INSERT INTO notes VALUES ('monday', 'buy milk')")
    db.close()
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    before = files_under(tmp_path)
    for path, why in ((notes, "no cells table (tables: notes)"), (empty, "an empty file")):
        run = cli("report", str(path), "--out", str(tmp_path / "out"))
        assert run.returncode != 0 and "Traceback" not in run.stderr
        assert run.stderr == f"error: {path} is not an attn_zoo results store: {why}\n"
        assert files_under(tmp_path) == before  # the same bytes, no -wal, -shm nor out folder


def test_a_missing_store_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "out")])
    assert str(exit_.value) == f"error: no results store at {tmp_path / 'none.sqlite'}"
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def read_only_mount(tmp_path):
    """A tmpfs mounted at tmp_path/ro, to be filled then made read-only by `remount_read_only`
    (skips where this process cannot mount: root does not heed chmod, a mount stops it too)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def remount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    with pytest.raises(OSError):  # read-only for root too
        (folder / "probe").touch()


def test_report_and_status_read_a_store_on_a_read_only_mount(read_only_mount, tmp_path, capsys):
    from grids import tiny_grid

    from ablations.grid.spec import load_grid

    grid = tiny_grid(read_only_mount, seeds=[0], training={"steps": 10})
    spec = load_grid(grid)
    store = ResultsStore(spec.store)
    for final, cell in zip((0.6, 0.8), spec.cells, strict=True):
        add_done(store, cell.config(), final)
    store.close()  # as a finished run leaves it: no -wal or -shm file
    remount_read_only(read_only_mount)
    before = files_under(read_only_mount)
    assert main(["report", str(spec.store), "--out", str(tmp_path / "out")]) == 0
    assert "## Task: same_pair" in whole_report(tmp_path / "out")
    assert main(["report", str(grid), "--out", str(tmp_path / "grid_out")]) == 0
    assert main(["ablate", "status", str(grid)]) == 0
    assert "2 done" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # a run cannot write there: it says why
        main(["ablate", "run", str(grid), "--set", "seeds=[0, 1]"])
    assert "cannot be written: its file or folder is read-only" in str(refused.value)
    assert files_under(read_only_mount) == before


def test_report_and_status_create_no_file_beside_a_closed_store(tmp_path, capsys):
    from grids import tiny_grid

    from ablations.grid.spec import load_grid

    (tmp_path / "grid").mkdir()
    grid = tiny_grid(tmp_path / "grid", seeds=[0], training={"steps": 10})
    spec = load_grid(grid)
    store = ResultsStore(spec.store)
    add_done(store, spec.cells[0].config(), 0.7)
    store.close()
    before = files_under(tmp_path / "grid")
    assert main(["report", str(spec.store), "--out", str(tmp_path / "out")]) == 0
    assert main(["ablate", "status", str(grid)]) == 0
    assert main(["ablate", "run", str(grid), "--dry-run"]) == 0
    assert files_under(tmp_path / "grid") == before  # no -wal or -shm file, the same bytes


# A kill in the folder swap ----------------------------------------------------------------

CHILD = """
import os, sys, time
from pathlib import Path
import ablations.report.folder as folder
from ablations.report.build import write_report

store, out, ready, point = sys.argv[1:]


def pause():
    Path(ready).write_text(str(os.getpid()))
    time.sleep(600)


if point == "swapped":  # the new report swapped in, the old one not deleted yet
    exchange = folder.exchange

    def swap_then_pause(first, second):
        assert exchange(first, second)
        pause()

    folder.exchange = swap_then_pause
else:  # a file system that cannot swap: the old report renamed aside, the new one not in yet
    folder.exchange = lambda first, second: False
    rename = Path.rename

    def rename_then_pause(self, target):
        moved = rename(self, target)
        if Path(target).name.startswith(f".{Path(out).name}.old-"):
            pause()
        return moved

    Path.rename = rename_then_pause
write_report(store, out)
"""


def start_killed_report(store: Path, out: Path, point: str) -> subprocess.Popen:
    """A process writing the report of `store` into `out` that stops at `point` of the swap."""
    ready = out.with_name(f"ready-{point}")
    command = [sys.executable, "-c", CHILD, str(store), str(out), str(ready), point]
    child = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
    child.ready = ready
    return child


def kill_when_ready(child: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not child.ready.exists():
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, "the report never reached its swap"
        time.sleep(0.1)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    child.ready.unlink()


def test_a_report_killed_in_its_folder_swap_leaves_a_whole_report(tmp_path):
    """Killed just after swapping the new report in (where the file system swaps in one step)
    and just after setting the old one aside (where it cannot): the target holds a whole
    report, or gets the old one back from the next report, which leaves no hidden folder."""
    store = ResultsStore(tmp_path / "store.sqlite")
    add_done(store, config(task="first"), 0.6)
    folders = {point: tmp_path / point.replace(" ", "_") / "rep" for point in ("swapped", "aside")}
    for out in folders.values():
        write_report(store, out)
    old = {point: files_under(out) for point, out in folders.items()}
    add_done(store, config(task="second"), 0.8)
    children = {point: start_killed_report(store.path, out, point) for point, out in
                folders.items()}  # fmt: skip
    for child in children.values():  # both start at once: they spend most of it importing
        kill_when_ready(child)

    swapped = folders["swapped"]
    assert "## Task: second" in whole_report(swapped)  # the new report, whole
    assert [name.split("-")[0] for name in hidden(swapped.parent)] == [".rep.partial"]

    aside = folders["aside"]
    assert not aside.exists()  # the old way's gap: the report folder is gone
    assert [name.split("-")[0] for name in hidden(aside.parent)] == [".rep.old", ".rep.partial"]
    recover(aside)  # what the next report does first: the old report back, the rest deleted
    assert files_under(aside) == old["aside"] and hidden(aside.parent) == []

    for out in folders.values():  # the next report
        write_report(store, out)
        assert "## Task: second" in whole_report(out) and hidden(out.parent) == []


# The user's files beside a report ---------------------------------------------------------


def test_a_report_written_again_keeps_the_files_it_did_not_write(tmp_path):
    """Found by a fifth hostile pass: notes and a hand-made table beside a report were deleted
    when the report was written again (any .md or .csv counted as the report's). The report
    lists its files in provenance.json; the next one replaces those (the plots of a task it no
    longer shows are gone) and carries every other entry over as it was: files, a folder, a
    link."""
    store = ResultsStore(tmp_path / "store.sqlite")
    add_done(store, config(task="first"), 0.6)
    second = add_done(store, config(task="second"), 0.8)
    out = write_report(store, tmp_path / "reports" / "out")
    written = sorted(p.name for p in out.iterdir())
    (out / "data").mkdir()
    for name in ("notes.md", "my_analysis.csv", "data/raw.txt"):
        (out / name).write_text(f"mine: {name}")
    (out / "latest.md").symlink_to("report.md")
    mine = {name: data for name, data in files_under(out).items() if name not in written}
    assert len(mine) == 4

    write_report(store, out, keys={second})  # the second task only
    names = {p.name for p in out.iterdir()}
    assert {name: data for name, data in files_under(out).items() if name in mine} == mine
    stale = {name for name in written if "first" in name}  # the first task's plots
    assert stale and not stale & names  # the previous report's: replaced
    record = json.loads((out / "provenance.json").read_text())["files"]
    assert sorted(names - set(record)) == ["data", "latest.md", "my_analysis.csv", "notes.md"]
    assert hidden(out.parent) == []


def test_a_users_file_named_as_a_new_report_file_is_refused_and_kept(tmp_path):
    """The user's selection.csv beside a report without a selection, then a report with one
    written into the folder: refused naming the file and what to do; nothing changes."""
    from ablations.grid.schema import Selection

    store = ResultsStore(tmp_path / "store.sqlite")
    for mechanism in ("a", "b"):
        add_done(store, config(mechanism=mechanism), 0.6)
    reports = tmp_path / "reports"
    out = write_report(store, reports / "out")
    (out / "selection.csv").write_text("mine")
    before = files_under(reports)
    refused = r"selection.csv is not a file of the previous report .* move it out of"
    with pytest.raises(FileExistsError, match=refused):
        write_report(store, out, selection=Selection(compare=[["a", "b"]]))
    assert files_under(reports) == before and hidden(reports) == []


# Status ---------------------------------------------------------------------------------


def test_status_prints_swept_values_apart_and_a_dash_for_steps_not_run(tmp_path, capsys):
    from grids import STD, tiny_grid

    from ablations.grid.spec import load_grid

    grid = tiny_grid(tmp_path, seeds=[0], mechanisms=[STD])
    grid.write_text(grid.read_text() + "[sweep]\ntraining.lr = [1e-5, 3e-5, 1e-4]\n")
    spec = load_grid(grid)
    store = ResultsStore(spec.store)
    key = store.claim(spec.cells[0].config())
    store.finish(key, "done", {"steps": 20, "test_acc": 0.6251})
    assert main(["ablate", "status", str(grid)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, *rows = lines[: 1 + len(spec.cells)]
    assert header.split() == ["task", "size", "mechanism", "training.lr", "seed", "status",
                              "steps", "test_acc"]  # fmt: skip
    cells = [row.split() for row in rows]
    assert [cell[3] for cell in cells] == ["1e-05", "3e-05", "0.0001"]
    assert cells[0][5:] == ["done", "20", "0.625"]
    assert cells[1][5:] == cells[2][5:] == ["todo", "-", "-"]  # not <NA>


# Pages are plain text ---------------------------------------------------------------------

LINK = "![x](http://evil.example/t.png) [click](http://evil.example) www.evil.example *em* `c`"
FORMULAS = ['=HYPERLINK("http://evil.example")', "+1+cmd", "-2+3", "@SUM(A1)", "\tx", "\rx"]
LONG = "".join(f"label {i} " for i in range(1_200))[:10_000]  # 10,000 characters


def finish(store: ResultsStore, cell: dict, status: str, **metrics) -> str:
    """Record `cell` with `status` and `metrics` (validation and test accuracy and loss, steps,
    parameters, ms per step: 0.5, 0.5, 0.7, 0.7, 40, 1000, 1.0 unless given); its key."""
    values = dict(val_acc=0.5, test_acc=0.5, val_loss=0.7, test_loss=0.7, steps=40,
                  params=1000, step_ms=1.0) | metrics  # fmt: skip
    curve = [[step, 0.7, values["val_loss"], values["val_acc"]] for step in (20, 40)]
    key = store.claim(cell)
    store.finish(key, status, values, curve, {"torch": "9.9.9"})
    return key


def test_labels_are_plain_text_in_markdown_csvs_and_plots(tmp_path):
    from markdown_it import MarkdownIt
    from matplotlib.image import imread

    from ablations.grid.schema import Selection
    from ablations.labels import FORMULA_START, short_label

    store = ResultsStore(tmp_path / "hostile.sqlite")
    mechanisms = {LINK: FORMULAS, LONG: [LONG + "a", LONG + "b"]}
    for task, labels in mechanisms.items():
        for i, mechanism in enumerate(labels):
            for seed in (0, 1):
                accuracy = 0.6 + i / 20 + seed / 100
                finish(store, config(task=task, mechanism=mechanism, seed=seed),
                       "done", val_acc=accuracy, test_acc=accuracy)  # fmt: skip
    compare = [[FORMULAS[0], FORMULAS[1]]]
    out = write_report(store, tmp_path / "out", selection=Selection(compare=compare))

    markdown = (out / "report.md").read_text()
    parser = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    tokens = [t for block in parser.parse(markdown) for t in [block, *(block.children or [])]]
    assert not [t for t in tokens if t.type == "link_open"]  # no link: not one
    images = [t.attrs["src"] for t in tokens if t.type == "image"]
    assert images and all(out.joinpath(src).is_file() for src in images)  # the report's PNGs only
    assert "http://" not in markdown and "www.evil" not in markdown  # no bare URL to link
    shown = parser.render(markdown)
    assert f"<h2>Task: {LINK}</h2>" in shown  # shown as written (no <em>, no <code>)

    csvs = {path.name: path for path in out.glob("*.csv")}
    assert sorted(csvs) == ["cells.csv", "curves.csv", "paired.csv", "selection.csv",
                            "summary.csv"]  # fmt: skip
    for name, path in csvs.items():
        with path.open(newline="") as file:
            fields = {field for row in csv.reader(file) for field in row}
        for field in fields:  # a formula only behind a quote; numbers as they are
            if field.startswith(FORMULA_START) and field != "-":
                float(field)
        shown = {"paired.csv": FORMULAS[:2], "curves.csv": []}.get(name, FORMULAS)  # paired:
        # the pair compared; curves: keys and numbers only
        assert {"'" + label.replace("\r", "\n") for label in shown} <= fields, name

    pngs = sorted(out.glob("*.png"))  # the learning curves (one parameter count: no
    assert len(pngs) >= 2  # accuracy-vs-parameters plot)
    for png in pngs:  # the 10,000-character labels made a plot 70,061 pixels wide
        assert imread(png).shape[1] < 3000, png.name
    short = [short_label(LONG + "a"), short_label(LONG + "b")]
    assert short[0] != short[1] and {len(s) for s in short} == {60}


# A result is done only if it is finite ----------------------------------------------------

NAN = float("nan")


def lr_cell(mechanism: str, lr: float, seed: int) -> dict:
    training = {"steps": 40, "batch_size": 8, "early_stop_target": 0.9, "lr": lr}
    return config(mechanism=mechanism, seed=seed, training=training)


def old_done_with_nan(store: ResultsStore, cell: dict) -> None:
    """`cell` stored done with NaN losses and accuracy 0.5, as training stored a cell whose
    last update made the weights NaN before it recorded such a cell as diverged (the store
    now refuses it: written here in SQL, as an old store holds it)."""
    metrics = {"val_acc": 0.5, "test_acc": 0.5, "val_loss": NAN, "test_loss": NAN, "steps": 40,
               "params": 1000, "step_ms": 1.0}  # fmt: skip
    key = store.claim(cell)
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE cells SET status='done', metrics=?, curve='[]' WHERE key=?",
                   (json.dumps(metrics), key))  # fmt: skip
    db.close()


def tables_of(page) -> list:
    from ablations.report.pages import Table

    return [(s, p) for s in page.sections for p in s.parts if isinstance(p, Table)]


def test_a_nan_result_is_never_selected_and_every_dash_says_why(tmp_path):
    from ablations.grid.schema import Selection
    from ablations.report.build import report_page

    store = ResultsStore(tmp_path / "nan.sqlite")
    for seed in (0, 1, 2):  # std: lr 1e-3 real, 1e30 NaN weights stored done (an old store)
        finish(store, lr_cell("std", 1e-3, seed), "done", val_acc=0.40 + seed / 100,
               test_acc=0.4, test_loss=0.9 + seed / 100)  # fmt: skip
        old_done_with_nan(store, lr_cell("std", 1e30, seed))
        old_done_with_nan(store, lr_cell("nan_only", 1e30, seed))
        if seed == 1:  # lr 0.1: one seed diverged as training now records it
            key = store.claim(lr_cell("std", 0.1, seed))
            store.finish(key, "diverged", {"diverged_at": 3, "val_loss": NAN}, [], {})
        else:
            finish(store, lr_cell("std", 0.1, seed), "done", val_acc=0.9)
    finish(store, lr_cell("one", 1e-3, 0), "done", test_loss=1.0)
    compare = [["std", "one"], ["std", "nan_only"]]
    selection = Selection(over=["training.lr"], reported="test_loss", compare=compare)
    (tmp_path / "page").mkdir()
    page = report_page(store, tmp_path / "page", selection=selection)
    chosen = pd.read_csv(tmp_path / "page" / "selection.csv").set_index("mechanism")

    std = chosen.loc["std"]  # not 1e30 (acc 0.5 of NaN weights), nor 0.1 (a seed diverged)
    assert std.best == "training.lr=0.001" and std.candidates == 1 and std.settings == 3
    assert std.n == 3 and std["mean"] == pytest.approx(0.91)
    assert std.excluded == ("training.lr=1e+30: 3 of 3 seeds diverged; "
                            "training.lr=0.1: 1 of 3 seeds diverged")  # fmt: skip
    none = chosen.loc["nan_only"]
    assert none.best == "-" and none.candidates == 0 and pd.isna(none["mean"])
    assert none.excluded == "training.lr=1e+30: 3 of 3 seeds diverged"

    sections = {section.heading: section for section in page.sections}
    (table,) = [p for p in sections["Selection: each mechanism at its best setting"].parts
                if hasattr(p, "data") and "best setting" in p.data]  # fmt: skip
    rows = table.data.set_index("mechanism")
    assert rows.loc["nan_only", "excluded (why)"] == (
        "no eligible setting: training.lr=1e+30: 3 of 3 seeds diverged"
    )
    assert not table.bold.to_numpy()[list(table.data.mechanism).index("nan_only")].any()
    for section, table in tables_of(page):  # every '-' of every table says why
        why = [c for c in table.data.columns if str(c).startswith(("why", "excluded"))]
        legend = any("-: " in getattr(part, "text", "") for part in section.parts)
        for i, row in table.data.iterrows():
            if any(str(text).startswith("-") for text in row) and not legend:
                assert why and any(row[c] for c in why), (section.heading, list(row))
            marks = table.bold.loc[i]
            assert not any(marks[c] and str(row[c]).startswith("-") for c in row.index)

    summary = pd.read_csv(tmp_path / "page" / "summary.csv")
    nan_rows = summary[summary.setting == "training.lr=1e+30"]
    assert set(nan_rows.seeds) == {0} and nan_rows.test_acc_mean.isna().all()
    assert set(nan_rows.why) == {"no seed finished: 3 diverged"}
    (unfinished,) = sections["Cells not in the tables"].parts
    details = set(unfinished.data.detail)
    diverged = unfinished.data[unfinished.data.status == "diverged"]
    assert "training.lr=1e+30" in set(diverged.setting)  # which setting of the mechanism
    assert "stored done with a non-finite val_loss, test_loss: counted as diverged" in details
    assert "loss diverged at step 3" in details
    pairs = pd.read_csv(tmp_path / "page" / "paired.csv")
    assert list(pairs.b) == ["one", "nan_only"] and list(pairs.n) == [1, 0]
    assert list(pairs.verdict) == [  # one ran seed 0 only: incomplete, naming the seeds;
        "incomplete (one: no cell of seed 1, 2, which the other has (not run)): no verdict yet",
        "-",  # nan_only: no setting to pair: its row says why
    ]


# Cells compared with different settings ---------------------------------------------------


def steps_cell(mechanism: str, seed: int, lr: float = 1e-3, steps: int = 40) -> dict:
    training = {"steps": steps, "batch_size": 8, "early_stop_target": 0.9, "lr": lr}
    return config(mechanism=mechanism, seed=seed, training=training)


def test_a_report_of_a_store_shows_the_settings_its_mechanisms_differ_in(tmp_path):
    from ablations.grid.schema import Selection

    store = ResultsStore(tmp_path / "mixed.sqlite")
    for seed in (0, 1):  # rel has its own learning rate: constant within each mechanism
        finish(store, steps_cell("std", seed, lr=1e-3), "done", val_acc=0.6 + seed / 10)
        finish(store, steps_cell("rel", seed, lr=3e-3), "done", val_acc=0.7 + seed / 10)
    selection = Selection(compare=[["rel", "std"]])
    out = write_report(store, tmp_path / "out", selection=selection)
    markdown = (out / "report.md").read_text()
    note = "training.lr: std 0.001, rel 0.003"
    assert note in section_of(markdown, "## Task: same_pair")
    assert note in section_of(markdown, "## Selection: each mechanism at its best setting")
    pairs = pd.read_csv(out / "paired.csv")  # still paired, seed by seed
    assert list(pairs.a) == ["rel"] and list(pairs.n) == [2]
    assert pd.read_csv(out / "summary.csv").setting.isna().all()  # no setting column added


def test_seeds_of_one_mechanism_trained_for_different_steps_are_told_apart(tmp_path):
    store = ResultsStore(tmp_path / "steps.sqlite")
    for seed, steps in ((0, 40), (1, 80)):  # the grid edited between runs
        finish(store, steps_cell("std", seed, steps=steps), "done")
        finish(store, steps_cell("rel", seed, steps=40), "done")
    out = write_report(store, tmp_path / "out")
    summary = pd.read_csv(out / "summary.csv")
    std = summary[summary.mechanism == "std"]
    assert sorted(std.setting) == ["training.steps=40", "training.steps=80"]
    assert list(std.cells) == [1, 1]  # not one setting of 2 seeds
    rel = summary[summary.mechanism == "rel"]
    assert list(rel.cells) == [2] and list(rel.setting) == ["training.steps=40"]


def test_a_partly_run_grid_is_reported_as_partly_run(tmp_path):
    """Found by a second hostile pass: a grid run with one of its two seeds (or without a
    mechanism) was reported as every cell finished, and its selection took settings with half
    the seeds. Cells of the grid that the store lacks are counted, listed as not run, and no
    setting that lacks one is selected."""
    lin = {"label": "lin", "name": "linear", "kwargs": {"n_heads": 2}}
    grid = tiny_grid(tmp_path, mechanisms=[STD, lin], training={"steps": 4, "eval_every": 2})
    grid.write_text(grid.read_text() + '[sweep]\ntraining.lr = [1e-3, 3e-2]\n'
                    '[selection]\nover = ["training.lr"]\n')  # fmt: skip
    assert main(["ablate", "run", str(grid), "--workers", "1", "--set", "seeds=[0]"]) == 0
    out = tmp_path / "report"
    assert main(["report", str(grid), "--out", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    assert "4 done" in markdown and "4 todo" in markdown
    assert "not run: a cell of the grid that the store does not hold" in markdown
    steps = pd.read_csv(out / "cells.csv", dtype=str)["metrics.steps"].dropna()
    assert len(steps) == 4 and steps.str.isdigit().all()  # beside cells not run: 4, not 4.0
    selection = pd.read_csv(out / "selection.csv")
    assert (selection.n == 0).all()  # no setting has both seeds: none is selected
    assert selection.excluded.str.contains("1 of 2 seeds not run").all()
