"""The grid runner: every cell recorded once, failures and divergence recorded and passed over,
resume after SIGKILL, the same metrics from every executor, and the CLI around it."""

import contextlib
import io
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from grids import REL, STD, tiny_grid
from rich.console import Console

from ablations.cli import main
from ablations.grid import spec as spec_module
from ablations.grid.cell import Cell
from ablations.grid.spec import SpecError, load_grid
from ablations.results.store import ResultsStore
from ablations.run import cell_worker, local_executor
from ablations.run.executors import make_executor
from ablations.run.progress import LiveProgress, Progress, fit_label, make_progress
from ablations.run.runner import check_cells, run_grid
from ablations.run.status import grid_status
from ablations.run.train import CellOutcome


def grid_file(tmp_path: Path, steps: int = 20) -> Path:
    return tiny_grid(tmp_path, training={"steps": steps})


def rows(spec) -> list[dict]:
    return list(ResultsStore(spec.store).rows())


def test_every_cell_recorded_once_and_a_second_run_skips_them(tmp_path):
    spec = load_grid(grid_file(tmp_path))
    out = io.StringIO()
    counts = run_grid(spec, workers=1, out=out)
    assert counts == {"done": 4, "failed": 0, "diverged": 0}
    first = rows(spec)
    assert sorted(r["key"] for r in first) == sorted(c.key for c in spec.cells)
    assert all(r["status"] == "done" and r["environment"]["commit"] for r in first)
    assert {(r["environment"]["device"], r["environment"]["dtype"]) for r in first} == {
        ("cpu", "float32")
    }  # where each cell trained, and in which dtype
    assert "4/4 finished" in out.getvalue()

    again = io.StringIO()
    assert run_grid(spec, workers=1, out=again) == {"done": 0, "failed": 0, "diverged": 0}
    assert "4 already finished, 0 to run" in again.getvalue() and rows(spec) == first


def test_a_failing_cell_is_recorded_with_its_traceback_and_the_grid_goes_on(tmp_path, monkeypatch):
    real = cell_worker.train_cell

    def flaky(cell, on_progress=None, keep_state=False, keep_maps=False, device=None, **resume):
        if cell.mechanism == "rel" and cell.seed == 1:
            raise RuntimeError("boom in cell rel/1")
        return real(cell, on_progress, keep_state, keep_maps, device, **resume)

    monkeypatch.setattr(cell_worker, "train_cell", flaky)
    spec = load_grid(grid_file(tmp_path))
    assert run_grid(spec, workers=1, out=io.StringIO()) == {"done": 3, "failed": 1, "diverged": 0}
    failed = [r for r in rows(spec) if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["config"]["mechanism"] == "rel"
    assert "Traceback" in failed[0]["error"] and "boom in cell rel/1" in failed[0]["error"]

    monkeypatch.setattr(cell_worker, "train_cell", real)
    assert run_grid(spec, workers=1, out=io.StringIO())["done"] == 0  # failed counts as finished
    assert run_grid(spec, workers=1, retry_failed=True, out=io.StringIO())["done"] == 1
    assert {r["status"] for r in rows(spec)} == {"done"} and len(rows(spec)) == 4


def test_diverging_cells_are_recorded_at_their_step(tmp_path):
    spec = load_grid(
        grid_file(tmp_path),
        ["training.lr=1e30", "training.grad_clip=1e30", "training.warmup_steps=1"],
    )
    assert run_grid(spec, workers=1, out=io.StringIO())["diverged"] == 4
    for row in rows(spec):
        assert row["status"] == "diverged" and 1 < row["metrics"]["diverged_at"] <= 20


def test_a_cell_that_cannot_train_stops_the_grid_before_any_training(tmp_path):
    kwargs = {k: v for k, v in REL["kwargs"].items() if k != "symbol_retrieval"}
    spec = load_grid(tiny_grid(tmp_path, mechanisms=[STD, {**REL, "kwargs": kwargs}]))
    with pytest.raises(SpecError, match=r"grid.toml: mechanism 'rel' .* needs symbols"):
        check_cells(spec)
    with pytest.raises(SpecError):
        run_grid(spec, workers=1, out=io.StringIO())
    assert not spec.store.exists()


@pytest.mark.slow  # `make test-slow`: the default suite stays under 10 minutes
def test_process_pool_and_ray_give_the_thread_worker_metrics(tmp_path):
    ray = pytest.importorskip("ray")
    spec = load_grid(grid_file(tmp_path))
    run_grid(spec, workers=1, out=io.StringIO())
    expected = {r["key"]: r["metrics"]["test_acc"] for r in rows(spec)}
    for executor, workers, name in (("local", 2, "pool"), ("ray", 2, "ray")):
        other = load_grid(grid_file(tmp_path), [f'store="{tmp_path / name}.sqlite"'])
        assert run_grid(other, executor=executor, workers=workers, out=io.StringIO()) == {
            "done": 4,
            "failed": 0,
            "diverged": 0,
        }
        assert {r["key"]: r["metrics"]["test_acc"] for r in rows(other)} == expected, executor
        assert {r["environment"]["device"] for r in rows(other)} == {"cpu"}, executor
    assert not ray.is_initialized()


def test_a_local_ray_instance_without_gpus_refuses_cells_that_ask_for_one():
    ray = pytest.importorskip("ray")
    with pytest.raises(SpecError, match=r"resources.num_gpus = 0.5 but the Ray cluster has 0 GPUs"):
        make_executor("ray", workers=1, resources={"num_cpus": 1, "num_gpus": 0.5})
    assert not ray.is_initialized()  # the instance it started is shut down


def test_sigkill_midway_then_resume_loses_and_duplicates_nothing(tmp_path):
    path = grid_file(tmp_path, steps=300)
    spec = load_grid(path)
    command = [sys.executable, "-m", "ablations.cli", "ablate", "run", str(path), "--workers", "1"]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    done_before = {}
    while time.monotonic() < deadline and not done_before:
        time.sleep(0.2)
        if spec.store.exists():
            with sqlite3.connect(spec.store) as db, contextlib.suppress(sqlite3.OperationalError):
                done_before = dict(  # (no cells table yet: the run is creating the store)
                    db.execute("SELECT key, finished FROM cells WHERE status='done'").fetchall()
                )
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    assert done_before, "no cell finished before the deadline"
    statuses = [r["status"] for r in rows(spec)]
    assert "running" in statuses or len(statuses) < 4  # killed midway

    subprocess.run(command, check=True, capture_output=True)
    after = rows(spec)
    assert len(after) == 4 and {r["status"] for r in after} == {"done"}
    assert len({r["key"] for r in after}) == 4
    for key, finished in done_before.items():  # finished cells were not trained again
        assert next(r["finished"] for r in after if r["key"] == key) == finished


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_run_pinned_to_one_core_trains_with_one_thread(tmp_path):
    # a run started on one core (taskset) beside another must not take every core's threads
    path = grid_file(tmp_path)
    command = [sys.executable, "-m", "ablations.cli", "ablate", "run", str(path), "--workers", "1"]
    core = min(os.sched_getaffinity(0))
    subprocess.run(
        command, check=True, capture_output=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )  # fmt: skip
    after = rows(load_grid(path))
    assert len(after) == 4 and {r["environment"]["threads"] for r in after} == {1}


def test_progress_line_and_eta_by_kind_of_cell(tmp_path):
    cells = load_grid(grid_file(tmp_path)).cells  # std s0, std s1, rel s0, rel s1
    out = io.StringIO()
    progress = Progress(cells, total=6, slots=2, interval=0, out=out)
    progress.started("a", cells[0])
    assert "same_pair/xs/std/seed0 starting" in progress.status_line()
    progress.step("a", 40, 0.25)
    line = progress.status_line()
    assert "[2/6 finished, 1 running" in line and "step 40 loss 0.250" in line
    assert "ETA -" in line  # nothing finished yet: no estimate
    progress.finished("a", CellOutcome("done", metrics={"test_acc": 0.5, "steps": 40}))
    assert "test_acc 0.500 in 40 steps" in out.getvalue()
    assert "[3/6 finished, 0 running, 0 failed" in progress.status_line()

    progress.durations = {("same_pair", "xs", "std"): [10.0], ("same_pair", "xs", "rel"): [30.0]}
    assert progress.expected(("same_pair", "xs", "rel")) == 30.0
    assert progress.expected(("same_pair", "xl", "rel")) == 20.0  # same task
    assert progress.expected(("copy", "xs", "std")) == 20.0  # any
    # pending: std s1 (10 s), rel s0 and rel s1 (30 s each): 70 s over 2 slots
    assert progress.eta() == "35s"


def test_on_a_terminal_the_progress_is_a_live_view_and_elsewhere_plain_lines(tmp_path):
    cells = load_grid(grid_file(tmp_path, steps=300)).cells
    assert type(make_progress(cells, 4, 1, 10.0, io.StringIO())) is Progress  # not a TTY
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)
    progress = LiveProgress(cells, total=4, slots=2, interval=10.0, console=console)
    progress.started("a", cells[0])
    progress.started("b", cells[2])
    progress.step("a", 150, 0.412)
    progress.tick()  # drawn in place: the overall counts and a row per running cell
    drawn = screen.getvalue()
    assert "0/4 finished · 2 running · 0 failed · 0 diverged · ETA -" in drawn
    assert "same_pair/xs/std/seed0" in drawn and "150/300" in drawn and "0.412" in drawn
    assert "same_pair/xs/rel/seed0" in drawn and "0/300" in drawn
    progress.finished("a", CellOutcome("done", metrics={"test_acc": 0.5, "steps": 300}))
    progress.close()
    progress.print(progress.status_line())  # what run_grid ends with, as plain lines do
    lines = screen.getvalue().splitlines()
    assert any(line.endswith("done     same_pair/xs/std/seed0: test_acc 0.500 in 300 steps (0s)")
               for line in lines)  # fmt: skip
    assert lines[-1].endswith("[1/4 finished, 1 running, 0 failed, 0 diverged, ETA 0s] "
                              "same_pair/xs/rel/seed0 starting")  # fmt: skip


def fake_outcome(
    cell: Cell, threads: int, progress=None, keep_state: bool = False, **placed
) -> CellOutcome:
    return CellOutcome("done", metrics={"test_acc": 1.0, "steps": 1})


def test_a_run_expands_the_grid_once_and_trains_the_cells_status_shows_unfinished(
    tmp_path, monkeypatch
):
    spec = load_grid(grid_file(tmp_path))
    store = ResultsStore(spec.store)
    std0, std1, rel0, rel1 = spec.cells
    store.finish(store.claim(std0.config()), "done", metrics={"test_acc": 1.0, "steps": 1})
    store.finish(store.claim(std1.config()), "failed", error="RuntimeError: boom")
    store.finish(store.claim(rel0.config()), "diverged", metrics={"diverged_at": 3})
    assert list(grid_status(spec).status) == ["done", "failed", "diverged", "todo"]
    expansions, expand = [], spec_module.expand
    monkeypatch.setattr(spec_module, "expand", lambda *a: expansions.append(1) or expand(*a))
    trained = []
    monkeypatch.setattr(
        local_executor,
        "run_cell",
        lambda cell, *args, **kwargs: trained.append(cell) or fake_outcome(cell, 1),
    )
    out = io.StringIO()
    assert run_grid(spec, workers=1, out=out)["done"] == 1
    assert "1 to run" in out.getvalue() and expansions == []  # the cells load_grid expanded
    assert run_grid(spec, workers=1, retry_failed=True, out=io.StringIO())["done"] == 1
    assert trained == [rel1, std1]
    assert list(grid_status(spec).status) == ["done", "done", "diverged", "done"]


def test_bad_executor_and_workers_are_named():
    with pytest.raises(ValueError, match="executor='dask' is not valid; valid: local, ray"):
        make_executor("dask")
    with pytest.raises(ValueError, match="workers=0: must be >= 1"):
        make_executor("local", workers=0)
    with pytest.raises(ValueError, match="address='auto' is for executor='ray'"):
        make_executor("local", address="auto")


def test_cli_dry_run_status_and_report(tmp_path, capsys):
    path = grid_file(tmp_path)
    assert main(["ablate", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("todo") == 5 and "4 cells" in out  # 4 rows + the count line
    assert main(["ablate", "run", str(path), "--workers", "1", "--set", "seeds=[0]"]) == 0
    assert main(["ablate", "status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 done, 2 todo" in out
    assert main(["report", str(path), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.md").exists()
    with pytest.raises(SystemExit, match="mechanisms\\[0\\].name = 'standrd' is not valid"):
        main(["ablate", "run", str(path), "--set", "mechanisms=[{name='standrd'}]"])


def test_the_live_table_keeps_swept_values_and_the_seed_readable_at_80_columns(tmp_path):
    path = grid_file(tmp_path, steps=300)
    path.write_text(path.read_text() + "[sweep]\ntraining.lr = [0.003]\n")
    cells = load_grid(path).cells
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=80, color_system=None)
    progress = LiveProgress(cells, total=4, slots=1, interval=10.0, console=console)
    progress.started("a", cells[0])
    progress.tick()
    progress.close()
    assert "/std/lr=0.003/seed0" in screen.getvalue()
    assert fit_label("same_pair/xs/std/lr=0.003/seed0", 19) == "…/lr=0.003/seed0"
    assert fit_label("short", 19) == "short" and len(fit_label("x" * 50, 10)) == 10


def test_a_run_prints_to_sys_stdout_as_it_is_at_the_call(tmp_path, monkeypatch):
    """Found when a test closed the stdout another test's import had bound: `out` defaulted to
    the sys.stdout of the moment ablations.run.runner was imported, and a later run printed into
    that closed file ("I/O operation on closed file"). It is looked up at each call now."""
    spec = load_grid(tiny_grid(tmp_path, seeds=[0], mechanisms=[STD]))
    assert run_grid(spec, workers=1, out=io.StringIO())["done"] == 1
    now = io.StringIO()
    monkeypatch.setattr(sys, "stdout", now)
    assert run_grid(spec, workers=1) == dict.fromkeys(("done", "failed", "diverged"), 0)
    assert "1 cells, 1 already finished, 0 to run" in now.getvalue()
