"""A grid of tiny cells on a real Ray cluster: `ray start --head` in a session of its own, the
CLI run against its address as a separate process, and one Ray worker SIGKILLed while it trains
a cell. Ray retries the cell, the run exits 0, and the store holds every cell done, once.

The cell that gets killed is chosen, not raced for: the driver runs with a `run_cell` whose
first attempt at that one cell writes its worker's pid to a marker file and then trains the cell
over and over until it is killed (a retry, which sees the marker, trains it once as usual). So
the kill lands mid-cell every time, and the cell being done proves Ray retried it.

The cluster is stopped by killing its session's processes, not with `ray stop`, which stops
every Ray process of the machine (other tests' instances included)."""

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from grids import STD, tiny_grid, with_heads

from ablations.grid.spec import load_grid
from ablations.results.store import ResultsStore

ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).parent / "ray"
TINY_TASK = {"name": "same_pair", "kwargs": {"n_train": 16, "n_validation": 8, "n_test": 8}}
TINY_SIZE = {"label": "xxs", "d_model": 8, "n_layers": 1}
TINY_TRAINING = {"steps": 1, "eval_every": 1, "batch_size": 4, "warmup_steps": 1}

# The CLI with run_cell replaced (pickled by value into the Ray tasks): the first attempt at
# the cell keyed VICTIM_KEY writes its pid to MARKER and trains that cell until it is killed.
DRIVER = """
import os, sys
from pathlib import Path
from ablations.run import ray_executor
from ablations.cli import main

MARKER, VICTIM_KEY = Path(sys.argv[1]), sys.argv[2]

def run_cell(cell, threads, progress=None, keep_state=False, device=None, imports=(), **resume):
    from ablations.run.cell_worker import run_cell as real  # in a Ray worker: the real one
    if cell.key == VICTIM_KEY and not MARKER.exists():
        partial = MARKER.with_suffix(".partial")
        partial.write_text(str(os.getpid()))
        partial.replace(MARKER)
        while True:
            real(cell, threads, progress, keep_state, device, imports, **resume)
    return real(cell, threads, progress, keep_state, device, imports, **resume)

ray_executor.run_cell = run_cell
sys.exit(main(sys.argv[3:]))
"""


def free_port() -> int:
    """A free TCP port, outside the range Ray keeps for its workers (10002-19999)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not 10002 <= port <= 19999:
            return port


def session(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live (not zombie) processes of session `sid`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        state, _, _, sid_of = stat.rsplit(")", 1)[1].split()[:4]
        if int(sid_of) == sid and state != "Z":
            found.append((int(pid), command.strip()))
    return found


def end_session(sid: int, grace: float = 2.0) -> list[tuple[int, str]]:
    """SIGTERM every process of session `sid`, SIGKILL those left after `grace` seconds; the
    processes still alive after that (none, normally)."""
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid, _ in session(sid):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait
        while session(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
    return session(sid)


class Cluster(NamedTuple):
    """A Ray head started by `ray start --head`: its `address`, the `sid` of its processes'
    session and the `env` (token authentication) a driver needs to connect."""

    address: str
    sid: int
    env: dict[str, str]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    pytest.importorskip("ray")
    if not RAY.exists():
        pytest.skip(f"no ray command beside {sys.executable}")
    if not Path("/proc/self/stat").exists():
        pytest.skip("finds the cluster's processes in /proc (Linux)")
    # A short folder: Ray's socket paths under it must fit in 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="rayc", dir="/tmp"))
    # Token authentication with a token of its own: nothing read from or written to ~/.ray.
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env.pop("RAY_ADDRESS", None)
    command = [
        str(RAY), "start", "--head", f"--port={free_port()}", "--num-cpus=2",
        "--disable-usage-stats", "--include-dashboard=false", f"--dashboard-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}", f"--temp-dir={temp}",
    ]  # fmt: skip
    start = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = start.communicate(timeout=120)
        assert start.returncode == 0, output
        found = re.search(r"ray start --address='([^']+)'", output)
        assert found, output
        yield Cluster(found.group(1), start.pid, env)
    finally:
        start.kill()
        start.wait()
        left = end_session(start.pid)
        shutil.rmtree(temp, ignore_errors=True)
        assert left == [], f"Ray processes left running: {left}"


def grid_of(folder: Path, cells: int) -> Path:
    """`cells` tiny cells (milliseconds each): two mechanisms x cells / 2 seeds."""
    return tiny_grid(
        folder,
        name=f"cluster{cells}",
        seeds=list(range(cells // 2)),
        tasks=[TINY_TASK],
        sizes=[TINY_SIZE],
        mechanisms=[with_heads(STD, "std1", 1), with_heads(STD, "std2", 2)],
        training=TINY_TRAINING,
    )


def ray_workers_running_a_cell(sid: int) -> set[int]:
    return {pid for pid, command in session(sid) if command.startswith("ray::run_cell")}


def run_with_a_worker_killed(cluster: Cluster, folder: Path, cells: int) -> None:
    path = grid_of(folder, cells)
    spec = load_grid(path)
    grid_cells = spec.cells
    assert len(grid_cells) == cells
    victim = grid_cells[cells // 2]  # mid-grid: cells finished before the kill, and after
    marker = folder / "victim.pid"
    args = [str(marker), victim.key, "ablate", "run", str(path), "--executor", "ray"]
    args += ["--address", cluster.address, "--interval", "5"]
    out, err = folder / "out.txt", folder / "err.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        run = subprocess.Popen(
            [sys.executable, "-c", DRIVER, *args], cwd=ROOT, env=cluster.env,
            start_new_session=True, stdout=stdout, stderr=stderr,
        )  # fmt: skip

    def output() -> str:
        return out.read_text()[-3000:] + err.read_text()[-3000:]

    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert run.poll() is None, f"the run ended before the victim cell: {output()}"
            assert time.monotonic() < deadline, f"the victim cell never started: {output()}"
            time.sleep(0.1)
        pid = int(marker.read_text())
        # a Ray worker of this cluster, training the cell (its first attempt never returns)
        assert pid in ray_workers_running_a_cell(cluster.sid), session(cluster.sid)
        os.kill(pid, signal.SIGKILL)
        code = run.wait(timeout=600)
    finally:
        end_session(run.pid)
        run.wait()
    assert code == 0, output()

    rows = list(ResultsStore(spec.store, readonly=True).rows())
    assert len(rows) == cells
    assert sorted(row["key"] for row in rows) == sorted(cell.key for cell in grid_cells)
    assert {row["status"] for row in rows} == {"done"}, [r for r in rows if r["status"] != "done"]
    assert all(row["owner"] and row["finished"] for row in rows)
    victim_row = next(row for row in rows if row["key"] == victim.key)
    assert victim_row["metrics"]["steps"] == 1  # retried by Ray, and trained as usual
    lines = out.read_text().splitlines()
    assert lines[-1].startswith(f"[{cells}/{cells} finished, 0 running, 0 failed"), output()
    assert sum(line.startswith("done ") for line in lines) == cells, output()
    assert "Traceback" not in output()


@pytest.mark.slow  # `make test-slow`: the default suite stays under 10 minutes
def test_500_cells_on_a_cluster_with_a_worker_killed_mid_cell(cluster, tmp_path):
    """The scale run: 500 tiny cells through `ray start --head` and its address, one worker
    killed mid-cell (about 20 s on 2 cores)."""
    run_with_a_worker_killed(cluster, tmp_path, 500)


def test_a_plugin_mechanism_runs_on_the_cluster(cluster, tmp_path):
    """examples/sliding_window.toml names its mechanism's module in `imports`: every Ray
    worker imports it before training (the driver's import alone would not reach them)."""
    grid = ROOT / "examples" / "sliding_window.toml"
    store = tmp_path / "sw.sqlite"
    args = ["ablate", "run", str(grid), "--executor", "ray", "--address", cluster.address]
    args += ["--set", f"store={store}", "--set", "training.steps=4", "--set", "seeds=[0]"]
    run = subprocess.run([sys.executable, "-m", "ablations.cli", *args], cwd=tmp_path,
                         env={**cluster.env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = list(ResultsStore(store, readonly=True).rows())
    assert sorted((r["config"]["mechanism"], r["status"]) for r in rows) == [
        ("standard", "done"), ("window8", "done"),
    ]  # fmt: skip
    assert all(r["environment"]["attn_zoo"] for r in rows)
