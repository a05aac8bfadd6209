"""Stopping a grid run: SIGINT (Ctrl-C) or SIGTERM ends `attn-zoo ablate run` within seconds
with exit code 130 or 143 and a one-line summary, no worker process left behind, the cells in
flight released (the next run trains them) and the finished ones kept; a second SIGINT exits at
once; a SIGKILLed driver takes its workers with it; losing Ray's progress channel costs the
progress lines only. Real processes, real signals; the grid's slow cells (about a minute each
here) could not finish within the timeouts, so a run that stops in time really stopped them."""

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from grids import MQAR_LONG, SAME_PAIR, STD, tiny_grid, with_heads

from ablations.grid.spec import load_grid
from ablations.results.store import ResultsStore, StoreError
from ablations.run import local_executor, ray_executor, runner
from ablations.run.train import LOST, CellOutcome

SUMMARY = re.compile(
    r"interrupted \((SIGINT|SIGTERM)\): (\d+) finished, (\d+) released, (\d+) not started; "
    r"run again to resume"
)
ROOT = Path(__file__).resolve().parents[1]


def grid_file(tmp_path: Path) -> Path:
    """2 fast cells (same_pair, a few seconds), then 2 slow ones (mqar over 1024 tokens, a
    minute); a progress report every 150 steps: none within the tests' window, so stopping
    must not wait for one."""
    return tiny_grid(
        tmp_path,
        name="interrupt",
        mechanisms=[STD],
        tasks=[SAME_PAIR, MQAR_LONG],
        training={"steps": 300, "eval_every": 150},
    )


def rows(store: Path) -> list[dict]:
    try:
        return list(ResultsStore(store, readonly=True).rows())
    except (FileNotFoundError, StoreError):  # not created yet
        return []


def start(tmp_path: Path, *args: str, code: str | None = None) -> subprocess.Popen:
    """The CLI (or `code` given the CLI's arguments) in a session of its own, its output in
    tmp_path/out.txt and err.txt."""
    head = ["-c", code, "ablate", "run"] if code else ["-m", "ablations.cli", "ablate", "run"]
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        run = subprocess.Popen(
            [sys.executable, *head, *args, "--interval", "1"],
            cwd=ROOT,
            start_new_session=True,
            stdout=out,
            stderr=err,
        )
    run.folder = tmp_path
    return run


def wait_for(run: subprocess.Popen, condition, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert run.poll() is None, f"the run ended early: {output(run)}"
        assert time.monotonic() < deadline, f"timed out waiting: {output(run)}"
        time.sleep(0.2)


def output(run: subprocess.Popen) -> str:
    return (run.folder / "out.txt").read_text() + (run.folder / "err.txt").read_text()


def session(sid: int) -> list[str]:
    """The live (not zombie) processes of session `sid`, as their /proc stat lines."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        state, _, _, sid_of = stat.rsplit(")", 1)[1].split()[:4]
        if int(sid_of) == sid and state != "Z":
            found.append(stat[:80])
    return found


def no_process_left(sid: int, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := session(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_session(run: subprocess.Popen) -> None:
    """Cleanup after a failed assertion: nothing of the run may go on training."""
    for pid in [int(stat.split()[0]) for stat in session(run.pid)]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    run.wait()


def fake_outcome(
    cell, threads: int, progress=None, keep_state: bool = False, **placed
) -> CellOutcome:
    return CellOutcome("done", metrics={"test_acc": 1.0, "steps": 1})


def slow_cells(store: Path, status: str) -> list[dict]:
    return [r for r in rows(store) if r["status"] == status and r["config"]["task"] == "mqar"]


def done_rows(store: Path) -> dict[str, float]:
    return {r["key"]: r["finished"] for r in rows(store) if r["status"] == "done"}


RUNS = [  # the default run: each signal once, on each local executor (the others: slow)
    pytest.param("local", 1, signal.SIGINT, id="thread-ctrl-c"),
    pytest.param("local", 1, signal.SIGTERM, id="thread-sigterm", marks=pytest.mark.slow),
    pytest.param("local", 2, signal.SIGINT, id="processes-ctrl-c", marks=pytest.mark.slow),
    pytest.param("local", 2, signal.SIGTERM, id="processes-sigterm"),
    pytest.param("ray", 2, signal.SIGINT, id="ray-ctrl-c", marks=pytest.mark.slow),  # 30 s
]


@pytest.mark.parametrize("executor, workers, signum", RUNS)
def test_a_signal_stops_the_run_within_seconds_and_a_rerun_finishes_it(
    tmp_path, monkeypatch, executor, workers, signum
):
    if executor == "ray":
        pytest.importorskip("ray")
    path = grid_file(tmp_path)
    store = load_grid(path).store
    run = start(tmp_path, str(path), "--executor", executor, "--workers", str(workers))
    try:
        # both fast cells done, a slow one training
        wait_for(run, lambda: len(done_rows(store)) == 2 and slow_cells(store, "running"))
        time.sleep(2.0)
        finished_before = done_rows(store)
        if signum == signal.SIGINT:  # Ctrl-C: the terminal signals the whole process group
            os.killpg(run.pid, signum)
        else:  # kill PID: the driver alone
            os.kill(run.pid, signum)
        sent = time.monotonic()
        code = run.wait(timeout=20)
        print(f"\n{executor} x{workers} {signum.name}: exited {time.monotonic() - sent:.1f} s "
              "after the signal")  # fmt: skip
        assert code == 128 + signum, output(run)
        assert no_process_left(run.pid) == []
    finally:
        kill_session(run)

    lines = (tmp_path / "out.txt").read_text().strip().splitlines()
    summary = SUMMARY.fullmatch(lines[-1])
    assert summary, output(run)
    name, finished, released, not_started = summary.groups()
    assert name == signum.name and int(finished) == 2 and int(released) >= 1
    assert int(released) + int(not_started) == 2
    assert "Traceback" not in output(run)
    after = rows(store)
    assert [r["status"] for r in after] == ["done", "done"]  # in flight: released (deleted)
    assert done_rows(store) == finished_before

    # a rerun trains exactly the two cells left (outcomes faked: the point is that it may)
    monkeypatch.setattr(local_executor, "run_cell", fake_outcome)
    counts = runner.run_grid(load_grid(path), workers=1, out=io.StringIO())
    assert counts == {"done": 2, "failed": 0, "diverged": 0}
    assert len(rows(store)) == 4 and {r["status"] for r in rows(store)} == {"done"}
    assert {k: v for k, v in done_rows(store).items() if k in finished_before} == finished_before


# The training thread below never reports progress nor calls a module, so the first SIGINT's
# shutdown waits for it (STOP_GRACE, made long here); the second SIGINT must not wait.
STUBBORN = """
import sys, time
from ablations.run import cell_worker, local_executor
from ablations.cli import main

def stubborn(cell, on_progress=None, keep_state=False, keep_maps=False, **resume):
    while True:
        time.sleep(0.05)

local_executor.STOP_GRACE = 300.0
cell_worker.train_cell = stubborn
sys.exit(main(sys.argv[1:]))
"""


def test_a_second_ctrl_c_during_a_slow_shutdown_exits_at_once(tmp_path, monkeypatch):
    path = grid_file(tmp_path)
    store = load_grid(path).store
    run = start(tmp_path, str(path), "--workers", "1", code=STUBBORN)
    try:
        wait_for(run, lambda: any(r["status"] == "running" for r in rows(store)))
        os.killpg(run.pid, signal.SIGINT)
        wait_for(run, lambda: "stopping the workers" in output(run), timeout=20)
        time.sleep(1.0)
        assert run.poll() is None  # the shutdown is waiting for the thread
        os.killpg(run.pid, signal.SIGINT)
        sent = time.monotonic()
        code = run.wait(timeout=10)
        print(f"\nsecond SIGINT: exited {time.monotonic() - sent:.2f} s after it")
        assert code == 130
        assert "SIGINT again: exiting now" in output(run)
        assert no_process_left(run.pid) == []
    finally:
        kill_session(run)
    # its claim was left in flight; the next run takes over a dead run's claims
    monkeypatch.setattr(local_executor, "run_cell", fake_outcome)
    assert runner.run_grid(load_grid(path), workers=1, out=io.StringIO())["done"] == 4


@pytest.mark.slow  # a real run stopped by a real signal: 10 to 20 s each
@pytest.mark.skipif(shutil.which("timeout") is None, reason="no coreutils timeout")
@pytest.mark.parametrize("sender", ["timeout", "apart"])
def test_coreutils_timeout_stops_the_run_gracefully(tmp_path, sender):
    """`timeout` sends SIGTERM to the run, then to its whole process group (the run again, and
    its workers): one stop, the graceful one (cells released, the summary), not the second
    signal's 'exiting now'. "timeout": coreutils' own, fired early by its timer signal; the
    run often handles the two deliveries as one. "apart": the same two deliveries, the second
    0.2 s after the first, as a loaded machine may order them: the run has handled the first."""
    path = tiny_grid(tmp_path, name="timeout", seeds=[0], mechanisms=[STD], tasks=[MQAR_LONG],
                     training={"steps": 300, "eval_every": 150})  # fmt: skip
    store = load_grid(path).store
    head = ["timeout", "600"] if sender == "timeout" else []
    command = [*head, sys.executable, "-m", "ablations.cli", "ablate", "run", str(path),
               "--workers", "2", "--interval", "1"]  # fmt: skip
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        run = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=out, stderr=err)
    run.folder = tmp_path
    try:
        wait_for(run, lambda: "starting" in output(run))  # the cell claimed, the handler set
        if sender == "timeout":
            os.kill(run.pid, signal.SIGALRM)  # timeout's own timer signal: its time is up now
        else:
            os.kill(run.pid, signal.SIGTERM)
            time.sleep(0.2)
            os.killpg(run.pid, signal.SIGTERM)
        code = run.wait(timeout=30)
        assert code == (124 if sender == "timeout" else 143), output(run)  # 124: timed out
        assert no_process_left(run.pid) == []
    finally:
        kill_session(run)
    said = output(run)
    assert "exiting now" not in said and "Traceback" not in said, said
    assert "SIGTERM: stopping the workers and releasing the cells in flight" in said
    assert SUMMARY.fullmatch(said.strip().splitlines()[-1]).group(1) == "SIGTERM", said
    assert rows(store) == []  # the cell in flight released, none left running


def test_workers_die_with_a_sigkilled_driver(tmp_path):
    path = grid_file(tmp_path)
    run = start(tmp_path, str(path), "--workers", "2")
    try:
        # both workers training (past their imports: a loaded machine takes many seconds)
        wait_for(run, lambda: len(set(re.findall(r"(\S+) step \d+", output(run)))) == 2)
        assert len(session(run.pid)) >= 3  # driver and two workers
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
        assert no_process_left(run.pid) == []
    finally:
        kill_session(run)


def test_ctrl_c_while_the_workers_start_stops_quietly(tmp_path):
    path = grid_file(tmp_path)
    store = load_grid(path).store
    run = start(tmp_path, str(path), "--workers", "2")
    try:  # both cells claimed: their workers are being spawned (importing torch takes seconds)
        wait_for(run, lambda: len([r for r in rows(store) if r["status"] == "running"]) == 2)
        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(timeout=20) == 130
        assert no_process_left(run.pid) == []
    finally:
        kill_session(run)
    assert "Traceback" not in output(run)  # workers start with SIGINT blocked, then ignore it
    assert "interrupted (SIGINT): 0 finished, 2 released, 2 not started" in output(run)
    assert rows(store) == []


def test_a_cell_the_executor_lost_is_released_not_recorded_failed(tmp_path, monkeypatch):
    path = grid_file(tmp_path)
    monkeypatch.setattr(runner, "check_cells", lambda spec: None)
    monkeypatch.setattr(local_executor, "run_cell", fake_outcome)
    real_wait = local_executor.LocalExecutor.wait
    lost = []

    def lose_the_first(self, handles, timeout):
        out = real_wait(self, handles, timeout)
        if out and not lost:
            lost.append(True)
            return [(out[0][0], CellOutcome(LOST, error="WorkerCrashedError: gone"))]
        return out

    monkeypatch.setattr(local_executor.LocalExecutor, "wait", lose_the_first)
    out = io.StringIO()
    spec = load_grid(path)
    assert runner.run_grid(spec, workers=1, out=out) == {"done": 3, "failed": 0, "diverged": 0}
    assert "released same_pair/xs/std/seed0: WorkerCrashedError: gone" in out.getvalue()
    assert len(rows(spec.store)) == 3  # the lost cell's claim was given back
    assert runner.run_grid(spec, workers=1, out=io.StringIO())["done"] == 1  # a plain rerun


def tiny_file(tmp_path: Path) -> Path:
    """Two cells of a few seconds, reporting progress every 5 steps."""
    return tiny_grid(
        tmp_path,
        seeds=[0],
        mechanisms=[STD, with_heads(STD, "std4", 4)],
        training={"steps": 400, "eval_every": 5},
        file="tiny.toml",
    )


@pytest.mark.slow  # `make test-slow`: the default suite stays under 10 minutes
def test_ray_progress_actor_killed_midway_every_cell_still_done(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    spec = load_grid(tiny_file(tmp_path))
    real_drain = ray_executor.RayExecutor.drain
    killed = []

    def drain_then_kill(self):
        events = real_drain(self)
        if events and not killed:  # a cell is training and reporting: cut the channel
            ray.kill(self.progress.actor)
            killed.append(events)
        return events

    monkeypatch.setattr(ray_executor.RayExecutor, "drain", drain_then_kill)
    out = io.StringIO()
    counts = runner.run_grid(spec, executor="ray", workers=2, out=out)
    assert killed and counts == {"done": 2, "failed": 0, "diverged": 0}, out.getvalue()
    assert max(step for _, step, _ in killed[0]) < 400  # killed while the cells trained
    assert [r["status"] for r in rows(spec.store)] == ["done", "done"]
    assert "note: progress channel lost" in out.getvalue()
    assert not ray.is_initialized()


def test_a_worker_process_killed_from_outside_loses_its_cell_not_the_grid(tmp_path, monkeypatch):
    spec = load_grid(tiny_file(tmp_path))
    real_drain = local_executor.LocalExecutor.drain
    killed = []

    def drain_then_kill(self):
        events = real_drain(self)
        if events and not killed:  # a worker is training: kill it as the OOM killer would
            busy = next(worker for worker in self.workers if worker.busy)
            os.kill(busy.process.pid, signal.SIGKILL)
            killed.append(busy.process.pid)
        return events

    monkeypatch.setattr(local_executor.LocalExecutor, "drain", drain_then_kill)
    out = io.StringIO()
    counts = runner.run_grid(spec, workers=2, out=out)
    assert killed and counts == {"done": 1, "failed": 0, "diverged": 0}, out.getvalue()
    assert f"WorkerDied: worker process {killed[0]} died (SIGKILL)" in out.getvalue()
    assert [r["status"] for r in rows(spec.store)] == ["done"]  # the lost cell was released
    monkeypatch.undo()
    assert runner.run_grid(spec, workers=1, out=io.StringIO())["done"] == 1  # a plain rerun
