"""Faults leave the store usable, and no input a user can type ends in a traceback: a full disk
(a real 256 KiB tmpfs) and a file-size limit stop `ablate run` in one line, with no cell left
running and no partial file, and the next run finishes the grid; a run paused past its lease
whose cell another run took over writes no checkpoint when it resumes; a corrupt store, a
folder given as the store and overrides nested thousands deep are one-line errors."""

import hashlib
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from grids import MQAR_LONG, SAME_PAIR, STD, tiny_grid

from ablations.cli import main
from ablations.grid.spec import load_grid
from ablations.results.store import ResultsStore, StoreError

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "ablations.cli"]
# Cells whose checkpoints (about 400 KB each) cannot fit a 256 KiB disk, or a 60 KB file limit
BIG = {"label": "s", "d_model": 64, "n_layers": 2}
FAST = {"steps": 2, "eval_every": 2, "batch_size": 8}


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env, **kwargs
    )


def statuses(grid: Path) -> list[str]:
    spec = load_grid(grid)
    try:
        rows = {r["key"]: r["status"] for r in ResultsStore(spec.store, readonly=True).rows()}
    except (FileNotFoundError, StoreError):  # not created yet
        rows = {}
    return [rows.get(cell.key, "todo") for cell in spec.cells]


def partials(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.partial"))


def one_line_stop(run: subprocess.CompletedProcess, what: str) -> None:
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    (stop,) = [line for line in run.stdout.splitlines() if line.startswith("stopped:")]
    assert what in stop and "run again to resume" in stop


def test_a_full_disk_stops_the_run_in_one_line_and_the_next_run_resumes(tmp_path):
    """Inside a user and mount namespace of its own (unshare), a 256 KiB tmpfs holds the store;
    the first checkpoint does not fit. After the stop the tmpfs grows to 64 MiB (space is
    back) and the same command finishes the grid."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("unshare -rm (a user namespace with its own mounts) is not allowed here")
    disk = tmp_path / "disk"
    disk.mkdir()
    grid = tiny_grid(tmp_path, mechanisms=[STD], sizes=[BIG], training=FAST, checkpoints=True)
    python = f"PYTHONPATH={ROOT} {sys.executable} -m ablations.cli"
    grid = f"{grid} --set store={disk}/full.sqlite"
    script = f"""
        mount -t tmpfs -o size=256k tmpfs {disk} || exit 99
        {python} ablate run {grid} --workers 1 > {tmp_path}/run1.txt 2>&1; echo $? > {tmp_path}/rc1
        {python} ablate status {grid} > {tmp_path}/status1.txt 2>&1
        find {disk} -name '*.partial' > {tmp_path}/partials1.txt
        mount -o remount,size=64m {disk}
        {python} ablate run {grid} --workers 1 > {tmp_path}/run2.txt 2>&1; echo $? > {tmp_path}/rc2
        {python} ablate status {grid} > {tmp_path}/status2.txt 2>&1
    """
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, timeout=600)
    if done.returncode == 99:
        pytest.skip("mounting a tmpfs in a user namespace is not allowed here")
    first = subprocess.CompletedProcess([], int((tmp_path / "rc1").read_text()),
                                        (tmp_path / "run1.txt").read_text(), "")  # fmt: skip
    one_line_stop(first, "No space left on device (the disk is full)")
    assert "running" not in (tmp_path / "status1.txt").read_text()  # released, not stuck
    assert (tmp_path / "partials1.txt").read_text() == ""
    assert (tmp_path / "rc2").read_text().strip() == "0", (tmp_path / "run2.txt").read_text()
    assert "2 done" in (tmp_path / "status2.txt").read_text()


@pytest.mark.slow  # `make test-slow`: the default suite stays under 10 minutes
def test_a_file_size_limit_stops_the_run_in_one_line_and_the_next_run_resumes(tmp_path):
    grid = tiny_grid(tmp_path, mechanisms=[STD], sizes=[BIG], training=FAST, checkpoints=True)

    def limit() -> None:  # 60 KB a file: the store fits, a checkpoint does not
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    one_line_stop(cli("ablate", "run", str(grid), "--workers", "1", preexec_fn=limit),
                  "File too large (a file-size limit: ulimit -f)")  # fmt: skip
    assert "running" not in statuses(grid) and not partials(tmp_path)
    assert cli("ablate", "run", str(grid), "--workers", "1").returncode == 0
    assert statuses(grid) == ["done"] * 2


def test_a_run_that_lost_its_claim_writes_no_checkpoint_when_it_resumes(tmp_path):
    """Run A is paused (SIGSTOP) while it trains a cell; its lease runs out (its heartbeat set
    back by a minute, as a pause of a minute would leave it) and run B takes the cell over and
    finishes it, checkpoint included. Resumed (SIGCONT), A must not rewrite B's checkpoint."""
    slow = {**MQAR_LONG, "kwargs": {**MQAR_LONG["kwargs"], "seq_len": 256}}
    grid = tiny_grid(tmp_path, mechanisms=[STD], tasks=[slow], seeds=[0], checkpoints=True,
                     training={"steps": 60, "eval_every": 60})  # fmt: skip
    spec = load_grid(grid)
    (cell,) = spec.cells
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (tmp_path / "a.txt").open("w") as out:
        a = subprocess.Popen([*CLI, "ablate", "run", str(grid), "--workers", "1"], cwd=ROOT,
                             stdout=out, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while statuses(grid) != ["running"]:
            assert a.poll() is None and time.monotonic() < deadline, (
                tmp_path / "a.txt"
            ).read_text()
            time.sleep(0.1)
        os.kill(a.pid, signal.SIGSTOP)
        with sqlite3.connect(spec.store) as db:
            db.execute("UPDATE cells SET heartbeat = heartbeat - 120")
        b = cli("ablate", "run", str(grid), "--workers", "1")
        assert b.returncode == 0 and statuses(grid) == ["done"], b.stdout + b.stderr
        checkpoint = ResultsStore(spec.store, readonly=True).checkpoint_path(cell.key)
        written_by_b = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
        b_stat = checkpoint.stat()
    finally:
        os.kill(a.pid, signal.SIGCONT)
    a.wait(timeout=300)
    assert "dropped" in (tmp_path / "a.txt").read_text()
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == written_by_b
    assert checkpoint.stat().st_mtime_ns == b_stat.st_mtime_ns and not partials(tmp_path)


def test_a_bad_store_or_deep_overrides_are_one_line_errors(tmp_path):
    grid = tiny_grid(tmp_path, mechanisms=[STD], tasks=[SAME_PAIR], training=FAST)
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database, " * 64)
    folder = tmp_path / "folder.sqlite"
    folder.mkdir()
    deep_file = tmp_path / "deep.toml"
    deep_file.write_text(grid.read_text() + "x = " + "[" * 3000 + "]" * 3000 + "\n")
    cases = {
        "is not a readable results store": ["--set", f"store={corrupt}"],
        "is a folder, not a results store file": ["--set", f"store={folder}"],
        "a key of more than 32 parts": ["--set", "a." * 3000 + "b=1"],
        "its value is nested more than 32 deep": ["--set", "x=" + "[" * 3000 + "]" * 3000],
        "nests tables or lists more than 32 deep": [
            "--set", "tasks[0].kwargs.x=" + "[" * 40 + "]" * 40
        ],
    }  # fmt: skip
    for message, args in cases.items():  # in this process: the CLI's own code path
        with pytest.raises(SystemExit) as stopped:
            main(["ablate", "run", str(grid), *args])
        assert str(stopped.value.code).startswith("error:") and message in str(stopped.value.code)
        assert len(str(stopped.value.code).splitlines()) == 1
    with pytest.raises(SystemExit, match="cannot read the grid spec: RecursionError"):
        main(["ablate", "run", str(deep_file), "--dry-run"])
    run = cli("ablate", "run", str(grid), "--set", f"store={corrupt}")  # and as a user runs it
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith("error:") and len(run.stderr.strip().splitlines()) == 1
    assert corrupt.read_bytes() == b"not a database, " * 64  # never turned into a store


def test_a_file_that_is_not_a_store_is_refused_by_every_command_and_left_as_it_was(tmp_path):
    """Found by a second hostile pass: `ablate run` added a cells table to a foreign SQLite
    database (and switched it to WAL even when it refused it); status and dry runs gave a
    traceback for a folder."""
    grid = tiny_grid(tmp_path, mechanisms=[STD], tasks=[SAME_PAIR], training=FAST)
    foreign = tmp_path / "notes.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE other (a)")
        db.execute("INSERT INTO other VALUES (1)")
    db.close()
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    folder = tmp_path / "folder.sqlite"
    folder.mkdir()
    before = {path: path.read_bytes() for path in (foreign, empty)}
    cases = {foreign: "is not an attn_zoo results store: no cells table (tables: other)",
             empty: "is not an attn_zoo results store: an empty file",
             folder: "is a folder, not a results store file"}  # fmt: skip
    for store, message in cases.items():
        commands = [["ablate", "run", "--dry-run"], ["ablate", "status"]]
        if store != empty:  # ablate run takes an empty file as a store another run is creating
            commands.append(["ablate", "run"])
        for command in commands:
            with pytest.raises(SystemExit) as stopped:
                main([*command, str(grid), "--set", f"store={store}"])
            assert message in str(stopped.value.code), (command, stopped.value.code)
    assert {path: path.read_bytes() for path in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["grid.toml", "notes.sqlite", "empty.sqlite", "folder.sqlite"]
    )  # no -wal, -shm, checkpoints or maps beside them


def test_a_retriever_defined_in_the_running_script_is_refused_with_workers(tmp_path):
    from ablations.grid.spec import SpecError
    from ablations.run.runner import run_grid
    from attn_zoo.symbols import SYMBOL_RETRIEVERS, PositionalSymbolRetriever

    class Mine(PositionalSymbolRetriever):
        pass

    Mine.__module__ = "__main__"  # as a class in the script that runs the grid
    SYMBOL_RETRIEVERS.register("mine_in_main", Mine)
    try:
        rel = {"label": "rel", "name": "relational", "kwargs": {
            "n_heads": 2, "symbol_retrieval": "mine_in_main",
            "symbol_retrieval_kwargs": {"max_length": 4}}}  # fmt: skip
        spec = load_grid(tiny_grid(tmp_path, mechanisms=[rel], seeds=[0]))
        with pytest.raises(SpecError, match="symbol_retrieval 'mine_in_main' is defined in the"):
            run_grid(spec, workers=2)
    finally:
        SYMBOL_RETRIEVERS.unregister("mine_in_main")


def test_plugins_that_exit_or_break_their_parent_are_one_line_errors(tmp_path, monkeypatch):
    from ablations.grid.plugins import import_plugins
    from attn_zoo.registry import PluginError

    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "broken_parent.py").write_text("raise RuntimeError('parent bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="cannot be imported: SystemExit: 0"):
        import_plugins(["exits"])
    with pytest.raises(PluginError, match="RuntimeError: parent bug"):
        import_plugins(["broken_parent.child"])


def test_bench_refuses_devices_it_cannot_use_and_an_interrupt_is_one_line(monkeypatch, capsys):
    from ablations.bench.measure import peak_memory_mb
    from ablations.cli import ablate

    for device, message in (("nonsense", "runs on cpu, cuda or cuda:N"), ("cuda", "is False here")):
        if device == "cuda" and torch.cuda.is_available():
            continue
        with pytest.raises(SystemExit, match=message):
            main(["bench", "--suite", "softmax", "--lengths", "8", "--device", device])
    freed = torch.ones(16 * 2**20 // 4)  # a peak below the start reads as unmeasurable
    assert not (peak_memory_mb(lambda: freed.resize_(0), "cpu") < 0)

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(ablate, "show_status", interrupted)
    assert main(["ablate", "status", "x.toml"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_a_device_or_a_pipe_as_the_store_is_one_line_and_nothing_is_written(tmp_path):
    """SQLite would write /dev/null-journal beside a device; status would trace back on a
    FIFO. Both commands refuse such a path before opening it."""
    grid = tiny_grid(tmp_path, mechanisms=[STD], training=FAST)
    fifo = tmp_path / "fifo.sqlite"
    os.mkfifo(fifo)
    for store in (fifo, Path("/dev/null")):
        for command in (["ablate", "run"], ["ablate", "status"]):
            with pytest.raises(SystemExit) as refused:
                main([*command, str(grid), "--set", f'store="{store}"'])
            assert "is not a regular file" in str(refused.value)
    assert not Path("/dev/null-journal").exists()


def test_a_learning_rate_beyond_float32_is_refused_before_any_cell(tmp_path):
    grid = tiny_grid(tmp_path, mechanisms=[STD], training=FAST)
    with pytest.raises(SystemExit) as refused:
        main(["ablate", "run", str(grid), "--set", "training.lr=1e300"])
    assert "training.lr = 1e+300 must be a finite float > 0 and < 3.4e38" in str(refused.value)


def test_a_label_with_an_escape_sequence_is_refused_in_one_short_escaped_line(tmp_path):
    """An escape sequence, a NUL and a 100,000-character label in a grid: `ablate run` and
    `ablate status` (real processes) refuse it (control characters are no label's:
    ablations/grid/schema.py Label) in one line that shows it escaped and short."""
    hostile = {**STD, "label": "std\x1b[31m\x1b]0;pwned\x07\x00" + "x" * 100_000}
    grid = tiny_grid(tmp_path, mechanisms=[hostile], seeds=[0], training=FAST)
    for command in ("run", "status"):
        done = cli("ablate", command, str(grid))
        assert done.returncode != 0 and done.stdout == ""
        text = done.stderr
        assert "\x1b" not in text and "\x00" not in text and "\x07" not in text
        assert "mechanisms[0].label = 'std\\x1b[31m" in text  # shown, as an escape
        assert "invisible (format or control) characters" in text
        assert len(text.splitlines()) == 1 and len(text) < 400
