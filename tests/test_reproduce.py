"""`attn-zoo reproduce REPORT_DIR` (ablations/run/reproduce.py): a report's cells rebuilt from its
cells.csv, rerun here, and compared metric by metric with what the report says."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from grids import REL, STD, tiny_grid

from ablations.grid.spec import load_grid
from ablations.report.build import write_report
from ablations.report.pages import write_csv
from ablations.results.cells_file import CellsFile
from ablations.results.frames import cells_table
from ablations.results.store import ResultsStore, config_key
from ablations.run.reproduce import FILE, TIMINGS, reproduce, summary
from ablations.run.runner import run_grid


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report of a tiny grid (2 mechanisms x 2 seeds) trained here with one thread."""
    tmp = tmp_path_factory.mktemp("reproduce")
    spec = load_grid(tiny_grid(tmp, mechanisms=[STD, REL]))
    assert run_grid(spec, workers=1, out=io.StringIO())["done"] == 4
    return write_report(ResultsStore(spec.store, readonly=True), tmp / "report")


def copied(report, tmp_path, edit=None):
    """The report's cells.csv (edited by `edit(frame)`) and provenance in a fresh folder."""
    folder = tmp_path / "copy"
    folder.mkdir()
    cells = pd.read_csv(report / "cells.csv", dtype=str, keep_default_na=False)
    if edit is not None:
        edit(cells)
    cells.to_csv(folder / "cells.csv", index=False)
    (folder / "provenance.json").write_bytes((report / "provenance.json").read_bytes())
    return folder


def test_the_command_reruns_cells_and_finds_them_identical_here(report, tmp_path):
    """Same machine, same code, the threads recorded: every metric but the timings comes back
    bit for bit, and the CSV says so per cell and metric."""
    folder = copied(report, tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "ablations.cli", "reproduce", str(folder), "--sample", "2"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    frame = pd.read_csv(folder / FILE, keep_default_na=False)
    assert frame.key.nunique() == 2 and not set(frame.metric) & TIMINGS
    assert {"test_acc", "test_loss", "val_loss"} <= set(frame.metric)
    assert (frame.difference.astype(float) == 0).all(), frame
    assert "test_acc: 2 of 2 cells identical" in run.stdout


def test_a_changed_number_in_the_report_shows_as_a_difference(report, tmp_path):
    """A metric of cells.csv moved by 0.25 (a report whose numbers the code no longer gives):
    the rerun's difference is -0.25 for that cell and metric, 0 elsewhere."""
    first = pd.read_csv(report / "cells.csv", dtype=str).key[0]

    def edit(cells):
        row = cells.key == first
        value = float(cells.loc[row, "metrics.test_loss"].iloc[0])
        cells.loc[row, "metrics.test_loss"] = str(value + 0.25)

    frame = reproduce(copied(report, tmp_path, edit), keys=[first])
    moved = frame[frame.metric == "test_loss"].difference.iloc[0]
    assert moved == pytest.approx(-0.25, abs=1e-12)
    assert (frame[frame.metric != "test_loss"].difference == 0).all()


def test_a_row_that_is_no_longer_its_cell_is_refused_before_training(report, tmp_path):
    """A setting changed in cells.csv: the config hashes to another key, refused naming both,
    and nothing is written."""

    def edit(cells):
        cells.loc[0, "training.lr"] = "0.5"

    folder = copied(report, tmp_path, edit)
    key = pd.read_csv(folder / "cells.csv", dtype=str).key[0]
    with pytest.raises(ValueError, match=f"cell {key}: the config its row holds hashes to"):
        reproduce(folder, keys=[key])
    assert not (folder / FILE).exists()


def test_a_key_that_is_no_done_cell_is_refused(report, tmp_path):
    with pytest.raises(ValueError, match="--key nope: no done cell"):
        reproduce(copied(report, tmp_path), keys=["nope"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the cell reruns")
def test_a_cell_recorded_on_a_gpu_is_listed_as_not_rerun(report, tmp_path):
    def edit(cells):
        cells["environment.device"] = "cuda"

    frame = reproduce(copied(report, tmp_path, edit), sample=1)
    assert list(frame.note) == ["not rerun: ran on a GPU"]


def test_reruns_of_other_cells_add_up_and_a_cell_rerun_keeps_its_newest_rows(report, tmp_path):
    folder = copied(report, tmp_path)
    first, second = pd.read_csv(folder / "cells.csv", dtype=str).key[:2]
    reproduce(folder, keys=[first])
    reproduce(folder, keys=[second])
    reproduce(folder, keys=[first])
    frame = pd.read_csv(folder / FILE, dtype={"key": str})
    assert list(frame.key.drop_duplicates()) == [second, first]
    assert frame.groupby("key").metric.apply(lambda m: m.is_unique).all()


def test_a_file_named_reproduce_csv_that_is_not_one_is_refused_before_training(report, tmp_path):
    folder = copied(report, tmp_path)
    (folder / FILE).write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="is not a reproduce.csv"):
        reproduce(folder, sample=1)
    assert (folder / FILE).read_text() == "a,b\n1,2\n"


def test_a_rerun_with_other_threads_is_kept_beside_the_recorded_count(report, tmp_path):
    """--threads 2 (a run-to-run variance probe): its rows sit beside the one-thread rerun's,
    each saying how many threads it ran with and how many the report's cell had."""
    folder = copied(report, tmp_path)
    key = pd.read_csv(folder / "cells.csv", dtype=str).key[0]
    reproduce(folder, keys=[key])
    reproduce(folder, keys=[key], threads=2)
    frame = pd.read_csv(folder / FILE, dtype={"key": str})
    assert sorted(frame.threads.unique()) == [1, 2] and set(frame.committed_threads) == {1}
    one, two = (frame[frame.threads == n].set_index("metric") for n in (1, 2))
    assert list(one.index) == list(two.index)


def test_a_report_rebuilt_keeps_the_comparison_and_names_it(report, tmp_path):
    """Rebuilt from its cells.csv, or written again into its folder, a report keeps its
    reproduce.csv and says in its provenance what it found."""
    folder = tmp_path / "report"
    write_report(report / "cells.csv", folder)
    reproduce(folder, sample=1)
    rebuilt = write_report(folder / "cells.csv", tmp_path / "rebuilt")
    assert (rebuilt / FILE).read_bytes() == (folder / FILE).read_bytes()
    for page in (rebuilt / "report.md", folder / "report.md"):
        text = page.read_text()
        assert ("Reproduced (reproduce.csv): 1 of the report's cells rerun at" in text) == (
            page.parent == rebuilt
        )
    write_report(rebuilt / "cells.csv", folder)  # the folder of the comparison replaced
    assert "Reproduced (reproduce.csv)" in (folder / "report.md").read_text()


@pytest.mark.parametrize("bad", ["-2", "abc"])
def test_a_recorded_thread_count_that_is_none_is_refused_naming_the_cell(report, tmp_path, bad):
    def edit(cells):
        cells["environment.threads"] = bad

    folder = copied(report, tmp_path, edit)
    with pytest.raises(ValueError, match=r"cell \w+: environment.threads = .* is no thread count"):
        reproduce(folder, sample=1)
    assert not (folder / FILE).exists()


def test_a_reproduce_csv_with_a_bad_thread_count_is_refused_before_training(report, tmp_path):
    folder = copied(report, tmp_path)
    reproduce(folder, sample=1)
    frame = pd.read_csv(folder / FILE, dtype=str, keep_default_na=False)
    frame["threads"] = ""
    frame.to_csv(folder / FILE, index=False)
    with pytest.raises(ValueError, match="its threads column holds other than counts"):
        reproduce(folder, sample=1)


def test_an_empty_text_setting_comes_back_from_cells_csv_under_its_key(tmp_path):
    """relations_game_files' ood_file = "" (documented as none) is an empty CSV cell, as is the
    setting of a cell that has none: read back, each row's config is the one it hashes to its
    key from, "" where the cell had it, absent where it had none."""
    base = {"grid": "g", "task": "rg", "task_name": "relations_game_files", "size": {"label": "xs"},
            "mechanism": "std", "mechanism_name": "standard", "mechanism_kwargs": {},
            "training": {"steps": 4}, "seed": 0}  # fmt: skip
    configs = [
        {**base, "task_kwargs": {"train_file": "boards.npz", "ood_file": ""}},
        {**base, "task_kwargs": {"train_file": "boards.npz"}},
    ]
    rows = [
        {"key": config_key(config), "status": "pending", "config": config} for config in configs
    ]
    write_csv(cells_table(rows), tmp_path / "cells.csv")
    assert [row["config"] for row in CellsFile(tmp_path / "cells.csv").rows()] == configs


@pytest.mark.slow  # two processes that load torch: tens of seconds on a busy machine
def test_two_reproduce_runs_at_once_keep_both_runs_rows(report, tmp_path):
    """Two processes rerun cells of one report at once, each having read reproduce.csv before
    the other writes it (they meet in `on_cell`, before training): both runs' rows are kept."""
    folder = copied(report, tmp_path)
    keys = list(pd.read_csv(folder / "cells.csv", dtype=str).key[:2])
    met = [tmp_path / f"started{n}" for n in range(2)]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", MEETING, str(folder), key, str(met[n]), str(met[1 - n])],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for n, key in enumerate(keys)
    ]
    for run in runs:
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-2000:]
    frame = pd.read_csv(folder / FILE, dtype={"key": str})
    assert sorted(frame.key.unique()) == sorted(keys)


WAIT_FOR = """
import time
from pathlib import Path


def wait_for(path, what):
    deadline = time.monotonic() + 300
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise SystemExit(what)
        time.sleep(0.01)
"""  # the start of a child's script: wait_for(a file another process makes, what it means)

MEETING = (
    WAIT_FOR
    + """
import sys
from ablations.run.reproduce import reproduce

folder, key, mine, other = sys.argv[1:]

def meet(i, n, cell):
    Path(mine).touch()
    wait_for(other, "the other run never started")

reproduce(Path(folder), keys=[key], on_cell=meet)
"""
)


def with_plugin_mechanism(report, cells):
    """Edit: the first cell as if its mechanism were 'plugmech' of a plugin it recorded (its key
    the hash of that config), every cell recording the plugin /elsewhere/plug.py."""
    config = CellsFile(report / "cells.csv").rows()[0]["config"]
    cells["environment.plugins"] = str({"/elsewhere/plug.py": "ab" * 32})
    cells.loc[0, "mechanism_name"] = "plugmech"
    cells.loc[0, "key"] = config_key({**config, "mechanism_name": "plugmech"})


def test_a_plugin_mechanism_unknown_here_is_refused_naming_the_recorded_plugin(report, tmp_path):
    """Without --import, a cell of a plugin's mechanism is refused before training, the error
    naming the plugin the cell recorded and how to pass it; nothing is written."""
    folder = copied(report, tmp_path, lambda cells: with_plugin_mechanism(report, cells))
    key = pd.read_csv(folder / "cells.csv", dtype=str).key[0]
    expected = (
        rf"cell {key} \(.*\): unknown mechanism: 'plugmech'\..* The cell was trained with the "
        r"plugins /elsewhere/plug.py: pass each with --import"
    )
    with pytest.raises(ValueError, match=expected):
        reproduce(folder, keys=[key])
    assert not (folder / FILE).exists()


def test_a_rerun_with_other_plugin_code_than_the_cell_recorded_says_so(report, tmp_path):
    """The cell recorded a plugin (its digest) that this rerun does not import: every row of it
    notes the plugin code each run had, its numbers compared all the same."""
    folder = copied(report, tmp_path, lambda cells: with_plugin_mechanism(report, cells))
    key = pd.read_csv(folder / "cells.csv", dtype=str).key[1]
    frame = reproduce(folder, keys=[key])
    assert len(frame) > 1 and (frame.difference == 0).all()
    noted = (
        "other plugin code: the cell was trained with {plug.py: abababababab}, the rerun imports"
    )
    assert frame.note.str.startswith(noted).all(), list(frame.note)


def test_a_metric_one_run_lacks_is_a_row_with_a_note_and_not_identical(report, tmp_path):
    """A committed metric the rerun does not give (extra) and one the committed row leaves empty
    (test_acc): a row each with its note, and the summary counts neither cell identical."""
    first = pd.read_csv(report / "cells.csv", dtype=str).key[0]

    def edit(cells):
        cells["metrics.extra"] = ""
        cells.loc[cells.key == first, ["metrics.extra", "metrics.test_acc"]] = ["0.5", ""]

    frame = reproduce(copied(report, tmp_path, edit), keys=[first])
    notes = frame.set_index("metric").note
    assert notes["extra"] == "missing in the rerun"
    assert notes["test_acc"] == "missing in the committed cells.csv"
    assert (notes.drop(["extra", "test_acc"]) == "").all()
    lines = summary(frame)
    assert {"extra: 0 of 1 cells identical", "test_acc: 0 of 1 cells identical"} <= set(lines)
    assert any(line.endswith(" extra: missing in the rerun") for line in lines), lines


REPORT_PAUSED = (
    WAIT_FOR
    + """
import sys
import ablations.report.build as build

folder, read, go = sys.argv[1:]
carried_reruns, reads = build.carried_reruns, []


def read_then_wait(store, final):  # the second read, under the lock (the first checks the file)
    reruns = carried_reruns(store, final)
    reads.append(final)
    if len(reads) == 2:
        Path(read).touch()
        wait_for(go, "never told to go on")
    return reruns


build.carried_reruns = read_then_wait
build.write_report(Path(folder) / "cells.csv", Path(folder))
"""
)

REPRODUCE_TELLING_WHEN_IT_WAITS = """
import fcntl, sys
from pathlib import Path
from ablations.run.reproduce import reproduce

folder, key, waits = sys.argv[1:]
flock = fcntl.flock


def flock_telling_when_it_waits(handle, operation):
    try:
        flock(handle, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        Path(waits).touch()
        flock(handle, operation)


fcntl.flock = flock_telling_when_it_waits
reproduce(Path(folder), keys=[key])
"""


def child(*args: str) -> subprocess.Popen:
    """`python -c ARGS` in a process of its own, its stderr kept."""
    return subprocess.Popen([sys.executable, "-c", *args], stderr=subprocess.PIPE, text=True)


def wait_until(done, *processes: subprocess.Popen) -> None:
    """Poll until `done()`, failing with a process's stderr when it ends first."""
    deadline = time.monotonic() + 300
    while not done():
        for process in processes:
            assert process.poll() is None, process.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "never came"
        time.sleep(0.01)


def finished(*processes: subprocess.Popen) -> list[tuple[int, str]]:
    """The exit status and stderr of each process, each killed if it outlives 300 seconds."""
    results = []
    for process in processes:
        try:
            _, err = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        results.append((process.returncode, err))
    return results


@pytest.mark.slow  # two processes that load torch: about ten seconds on a busy machine
def test_a_report_rewritten_while_reproduce_runs_keeps_the_rows_reproduce_wrote(report, tmp_path):
    """The report of a folder is rewritten into it from its cells.csv, and an `attn-zoo
    reproduce` of that folder reruns a cell meanwhile, in two processes: the report, paused
    just after it read reproduce.csv, goes on to swap its folder in only once the rerun has
    written its rows or waits for the lock. The rows are in the folder after both (they were
    deleted with the old folder, which the rerun had locked)."""
    folder = write_report(report / "cells.csv", tmp_path / "report")
    key = pd.read_csv(folder / "cells.csv", dtype=str).key[0]
    read, go, waits = (tmp_path / name for name in ("read", "go", "waits"))
    writer = child(REPORT_PAUSED, str(folder), str(read), str(go))
    rerun = None
    try:
        wait_until(read.exists, writer)
        rerun = child(REPRODUCE_TELLING_WHEN_IT_WAITS, str(folder), key, str(waits))
        wait_until(lambda: waits.exists() or rerun.poll() is not None, writer)
    finally:
        go.touch()  # the report goes on (at once where something failed)
        results = finished(writer, *filter(None, [rerun]))
    for returncode, err in results:
        assert returncode == 0, err[-2000:]
    frame = pd.read_csv(folder / FILE, dtype={"key": str})
    assert list(frame.key.unique()) == [key] and (frame.difference == 0).all()


INTERRUPTED = """
import sys, time
from pathlib import Path
import ablations.run.reproduce as reproduce
from ablations.cli import main

folder, training = sys.argv[1:]
run_cell, calls = reproduce.run_cell, []


def the_second_cell_waits_to_be_stopped(*args, **kwargs):
    calls.append(args)
    if len(calls) == 2:
        Path(training).touch()
        time.sleep(600)
    return run_cell(*args, **kwargs)


reproduce.run_cell = the_second_cell_waits_to_be_stopped
sys.exit(main(["reproduce", folder, "--sample", "3"]))
"""


@pytest.mark.parametrize(
    "stop",
    [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],  # one process each
    ids=["SIGINT", "SIGTERM"],
)
def test_a_stopped_reproduce_keeps_the_reruns_it_finished(report, tmp_path, stop):
    """`attn-zoo reproduce --sample 3` (a real process) stopped by SIGINT (Ctrl-C) or SIGTERM
    at its second cell, which waits there in place of training: the first cell's rows are in
    reproduce.csv, the exit status is 128 + the signal and the last line says how many cells
    were kept (every rerun was lost: the file was written once, at the end)."""
    folder = copied(report, tmp_path)
    training = tmp_path / "training"
    stopped = child(INTERRUPTED, str(folder), str(training))
    try:
        wait_until(training.exists, stopped)
    finally:
        stopped.send_signal(stop)  # at once where something failed
        [(returncode, err)] = finished(stopped)
    assert returncode == 128 + stop, err[-2000:]
    assert err.splitlines()[-1] == (
        f"interrupted ({stop.name}): the rows of 1 of 3 cells are kept in {folder / FILE}; "
        "the cell in progress and those after it were not rerun"
    )
    frame = pd.read_csv(folder / FILE, dtype={"key": str})
    assert frame.key.nunique() == 1 and (frame.difference == 0).all()
