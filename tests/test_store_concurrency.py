"""Claims on one results store shared by several runs: real processes claim each cell once, a
finished row is never reset, a dead process's claim is taken over and a live one's is not, only
the owner finishes or releases, and two grid runs on one store train each cell once."""

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from grids import SAME_PAIR, STD, XS, small, tiny_grid, with_heads

from ablations.grid.spec import load_grid
from ablations.results.store import ClaimError, ResultsStore, config_key, new_owner
from ablations.run import local_executor, runner
from ablations.run.train import CellOutcome

REPO = Path(__file__).resolve().parents[1]


def python(snippet: str, *args: object) -> subprocess.Popen:
    """A python process running `snippet` with `args`, its stdout piped as text."""
    command = [sys.executable, "-c", textwrap.dedent(snippet), *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO)


def wait_for(paths: list[Path], processes: list[subprocess.Popen]) -> None:
    """Until every file of `paths` exists; AssertionError if a process ends before."""
    while not all(path.exists() for path in paths):
        ended = [process.communicate()[0] for process in processes if process.poll() is not None]
        assert not ended, f"a process ended before it was ready: {ended}"
        time.sleep(0.01)


# Both open the store and wait for the go file, then claim every cell and finish the ones they
# got, each printing the seeds it claimed.
CLAIMER = """
    import sys, time
    from pathlib import Path
    from ablations.results.store import ResultsStore
    path, ready, go, cells = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    store = ResultsStore(path)
    ready.touch()
    while not go.exists():
        time.sleep(0.001)
    for seed in range(cells):
        key = store.claim({"seed": seed})
        if key is not None:
            print(seed, flush=True)
            time.sleep(0.002)  # "training": the store is free for the other process meanwhile
            store.finish(key, "done", metrics={"by": store.owner})
"""


def test_two_processes_claim_every_cell_exactly_once(tmp_path):
    path, go, cells = tmp_path / "results.sqlite", tmp_path / "go", 100
    ready = [tmp_path / "ready0", tmp_path / "ready1"]
    processes = [python(CLAIMER, path, flag, go, cells) for flag in ready]
    wait_for(ready, processes)
    go.touch()
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0]
    first, second = ({int(seed) for seed in output.split()} for output in outputs)
    assert first.isdisjoint(second) and first | second == set(range(cells))
    rows = list(ResultsStore(path, readonly=True).rows())
    assert len(rows) == cells and {row["status"] for row in rows} == {"done"}
    assert all(row["metrics"]["by"] == row["owner"] for row in rows)  # finished by its claimer


def test_a_finished_row_is_never_reset_by_a_claim(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    done, diverged, failed = {"seed": 0}, {"seed": 1}, {"seed": 2}
    store.finish(store.claim(done), "done", metrics={"acc": 0.9}, curve=[[1, 0.9]])
    store.finish(store.claim(diverged), "diverged", metrics={"diverged_at": 4})
    store.finish(store.claim(failed), "failed", error="Traceback ...")
    before = {row["key"]: row for row in store.rows()}

    other = ResultsStore(store.path)  # another run, with its own owner
    for config in (done, diverged, failed):
        assert other.claim(config) is None
    assert other.claim(done, retry_failed=True) is None
    assert other.claim(diverged, retry_failed=True) is None
    assert {row["key"]: row for row in store.rows()} == before  # nothing written

    assert other.claim(failed, retry_failed=True) == config_key(failed)
    row = {row["key"]: row for row in store.rows()}[config_key(failed)]
    assert row["status"] == "running" and row["owner"] == other.owner and row["error"] is None


def test_only_the_owner_finishes_or_releases_its_claim(tmp_path):
    first, second = ResultsStore(tmp_path / "r.sqlite"), ResultsStore(tmp_path / "r.sqlite")
    config = {"seed": 0}
    key = first.claim(config)
    assert second.claim(config) is None  # held by a live run (this process)
    with pytest.raises(ClaimError, match="would overwrite another run's result"):
        second.finish(key, "done", metrics={"acc": 0.0})
    assert not second.release(key)
    (row,) = first.rows()
    assert row["status"] == "running" and row["owner"] == first.owner and row["metrics"] is None

    assert first.release(key)  # given back: claimable at once by another run
    assert first.status(config) is None and second.claim(config) == key
    with pytest.raises(ClaimError):
        first.finish(key, "done")
    second.finish(key, "done", metrics={"acc": 1.0})
    with pytest.raises(ClaimError, match="is done"):  # finishing twice would overwrite it
        second.finish(key, "failed", error="late")
    assert first.status(config) == "done"


def test_a_claim_is_stale_after_its_lease_and_kept_fresh_by_heartbeats(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    elsewhere = "another-host:12345:abcdef"  # a run on another machine: no pid to check here
    config = {"seed": 0}
    key = store.claim(config, elsewhere)
    assert store.claim(config) is None

    def age(seconds: float) -> None:
        with sqlite3.connect(store.path) as db:
            db.execute("UPDATE cells SET heartbeat=?", (time.time() - seconds,))
        db.close()

    age(store.lease + 30)
    assert store.heartbeat([key, "no-such-key"], elsewhere) == 1
    assert store.heartbeat([key], new_owner()) == 0  # only the owner's claims
    assert store.claim(config) is None  # the heartbeat made it fresh again
    age(store.lease + 30)
    assert store.claim(config) == key  # stale: taken over
    (row,) = store.rows()
    assert row["owner"] == store.owner
    with pytest.raises(ClaimError):
        store.finish(key, "done", owner=elsewhere)  # the old owner's late result is refused


HOLDER = """
    import sys, time
    from ablations.results.store import ResultsStore
    store = ResultsStore(sys.argv[1])
    print(store.claim({"seed": 0}), flush=True)
    time.sleep(600)
"""


def test_the_claim_of_a_killed_process_is_taken_over_and_of_a_live_one_is_not(tmp_path):
    path = tmp_path / "r.sqlite"
    holder = python(HOLDER, path)
    try:
        key = holder.stdout.readline().strip()
        assert key == config_key({"seed": 0})
        store = ResultsStore(path)
        assert store.claim({"seed": 0}) is None  # its owner is alive
        (row,) = store.rows()
        assert row["owner"].split(":")[1] == str(holder.pid)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert store.claim({"seed": 0}) == key  # its heartbeat is fresh, but its pid is dead
    (row,) = store.rows()
    assert row["owner"] == store.owner and row["status"] == "running"


# The grid runner ------------------------------------------------------------------------------


def grid_spec(tmp_path: Path):
    return load_grid(
        tiny_grid(
            tmp_path,
            seeds=[0, 1, 2],
            tasks=[small(SAME_PAIR, n_train=64, n_evaluate=16)],
            sizes=[{**XS, "d_model": 8}],
            mechanisms=[STD, with_heads(STD, "std1", 1)],
            training={"steps": 10, "eval_every": 5, "batch_size": 8},
        )
    )


def fake_outcome(
    cell, threads: int, progress=None, keep_state: bool = False, **placed
) -> CellOutcome:
    return CellOutcome("done", metrics={"test_acc": 1.0, "steps": 1, "seed": cell.seed})


def test_a_run_skips_cells_held_by_a_live_run_and_releases_its_claims_when_interrupted(
    tmp_path, monkeypatch
):
    spec = grid_spec(tmp_path)
    configs = [cell.config() for cell in spec.cells]
    monkeypatch.setattr(runner, "check_cells", lambda spec: None)
    monkeypatch.setattr(local_executor, "run_cell", fake_outcome)
    other = ResultsStore(spec.store)
    held = other.claim(configs[0])  # another live run is training this cell

    out = io.StringIO()
    counts = runner.run_grid(spec, workers=1, out=out)
    assert counts["done"] == len(configs) - 1 and "skipped" in out.getvalue()
    rows = {row["key"]: row for row in other.rows()}
    assert rows[held]["status"] == "running" and rows[held]["owner"] == other.owner

    other.release(held)

    def interrupted(self, handles, timeout):
        raise KeyboardInterrupt

    monkeypatch.setattr(local_executor.LocalExecutor, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run_grid(spec, workers=1, out=io.StringIO())
    assert other.status(configs[0]) is None  # the claim in flight was given back
    assert other.claim(configs[0]) == held


# Both meet after their smoke tests, so both start the grid with every cell unfinished.
RUN_GRID = """
    import io, json, sys, time
    from pathlib import Path
    from ablations.run import runner
    from ablations.grid.spec import load_grid
    grid, me, other = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    check_cells = runner.check_cells

    def check_then_meet(spec):
        check_cells(spec)
        me.touch()
        deadline = time.monotonic() + 240
        while not other.exists():
            assert time.monotonic() < deadline, "the other run never got ready"
            time.sleep(0.01)

    runner.check_cells = check_then_meet
    print(json.dumps(runner.run_grid(load_grid(grid), workers=1, out=io.StringIO())))
"""


def test_two_runs_of_one_grid_on_one_store_train_each_cell_once(tmp_path):
    spec = grid_spec(tmp_path)
    flags = [tmp_path / "met0", tmp_path / "met1"]
    runs = [python(RUN_GRID, spec.path, flags[i], flags[1 - i]) for i in (0, 1)]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    counts = [json.loads(output.splitlines()[-1]) for output in outputs]
    cells = len(spec.cells)
    assert sum(count["done"] for count in counts) == cells  # each cell trained by one run
    rows = list(ResultsStore(spec.store, readonly=True).rows())
    assert len(rows) == cells and {row["status"] for row in rows} == {"done"}
    assert len({row["owner"] for row in rows}) <= 2


def test_a_run_meeting_the_store_file_another_run_is_creating_trains(tmp_path, monkeypatch):
    """SQLite creates an empty file before the schema: a run that reads the grid's status at
    that instant (it was refused as 'not a results store: an empty file') creates the schema
    itself first."""
    spec = grid_spec(tmp_path)
    monkeypatch.setattr(runner, "check_cells", lambda spec: None)
    monkeypatch.setattr(local_executor, "run_cell", fake_outcome)
    spec.store.parent.mkdir(parents=True, exist_ok=True)
    spec.store.touch()  # the other run's sqlite3.connect, before its first write
    counts = runner.run_grid(spec, workers=1, out=io.StringIO())
    assert counts["done"] == len(spec.cells)
