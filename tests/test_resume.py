"""Resuming a cell: interrupted mid-way (a checkpoint taken, the run killed), it trains on from
its last resume checkpoint when it runs again and ends with exactly the metrics and curve of an
uninterrupted run; the checkpoint is gone once the cell finishes; a damaged or foreign one is
ignored with a note; only the run holding the cell's claim writes one."""

import dataclasses
import errno
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from grids import STD, XS, tiny_grid

from ablations.grid.spec import load_grid
from ablations.results import store as store_module
from ablations.results.store import ResultsStore
from ablations.run import ray_executor
from ablations.run.progress import cell_label
from ablations.run.resume import ResumePlan
from ablations.run.runner import run_grid
from ablations.run.train import train_cell

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("wall_s", "step_ms")  # the only metrics that differ between two runs of a cell


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Cells train with one torch thread here (bitwise-equal runs; fast on a busy machine), in
    this process and in run_grid's thread worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(ray_executor, "usable_cpus", lambda: 1)
    yield
    torch.set_num_threads(threads)


def exact(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIMING}


def one_cell(tmp_path: Path, training: dict, size: dict = XS) -> Path:
    return tiny_grid(tmp_path, mechanisms=[STD], sizes=[size], seeds=[0], training=training)


def resume_file(spec, cell) -> Path:
    with ResultsStore(spec.store) as store:
        return store.resume_path(cell.key)


DROPOUT = {**XS, "dropout": 0.1}  # draws from torch's generator at every step
# lr so small that validation accuracy never moves: patience (3 evaluations) ends the cell at
# step 20 only if the early-stopping state survives a checkpoint taken at step 12
PLATEAU = {"steps": 30, "eval_every": 5, "lr": 1e-12, "patience": 3}


@pytest.mark.parametrize(
    "size, training, every",
    [(DROPOUT, {"steps": 30, "eval_every": 5}, 10), (XS, PLATEAU, 6)],
    ids=["dropout", "patience"],
)
def test_a_cell_resumed_from_any_checkpoint_ends_as_an_uninterrupted_one(
    tmp_path, size, training, every
):
    (cell,) = load_grid(one_cell(tmp_path, training, size)).cells
    plain = train_cell(cell)
    points = []
    kept = train_cell(cell, resume=ResumePlan(every_steps=every),
                      on_checkpoint=lambda step, data: points.append((step, data)))  # fmt: skip
    assert kept.curve == plain.curve and exact(kept.metrics) == exact(plain.metrics)
    assert [step for step, _ in points] == list(range(every, plain.metrics["steps"], every))
    for step, data in points:
        resumed = train_cell(cell, resume=ResumePlan(data=data))
        assert resumed.notes == [f"resumed from its checkpoint at step {step}"]
        assert resumed.environment["resumed_from_step"] == step
        assert resumed.curve == plain.curve and exact(resumed.metrics) == exact(plain.metrics)

    other = dataclasses.replace(cell, seed=1)  # a checkpoint of another cell is not trusted
    foreign = train_cell(other, resume=ResumePlan(data=points[0][1]))
    assert foreign.notes == [
        "resume checkpoint ignored (written for another cell config); trained from step 0"
    ]
    assert "resumed_from_step" not in foreign.environment
    assert foreign.curve == train_cell(other).curve


def test_a_checkpoint_written_with_another_thread_count_is_not_resumed(tmp_path):
    """The thread count changes how a CPU sums: a cell checkpointed with 2 threads and resumed
    with 1 would end off the uninterrupted run's last bits. It starts over instead, saying
    why, and ends bitwise as the uninterrupted 1-thread run."""
    (cell,) = load_grid(one_cell(tmp_path, {"steps": 20, "eval_every": 5})).cells
    points = []
    torch.set_num_threads(2)  # restored to 1 below, and by `one_thread` after the test
    try:
        train_cell(cell, resume=ResumePlan(every_steps=10),
                   on_checkpoint=lambda step, data: points.append(data))  # fmt: skip
    finally:
        torch.set_num_threads(1)
    plain = train_cell(cell)
    resumed = train_cell(cell, resume=ResumePlan(data=points[0]))
    assert resumed.notes == [
        "resume checkpoint ignored (written with threads 2, not 1); trained from step 0"
    ]
    assert "resumed_from_step" not in resumed.environment
    assert resumed.curve == plain.curve and exact(resumed.metrics) == exact(plain.metrics)


def test_only_the_claims_owner_writes_a_resume_checkpoint_and_finishing_removes_it(tmp_path):
    store = ResultsStore(tmp_path / "grid.sqlite")
    for status in ("done", "failed", "diverged"):
        key = store.claim({"status": status})
        assert store.save_resume(key, b"step 10")
        assert not store.save_resume(key, b"not mine", owner="host:1:other")  # lost the claim
        assert store.resume_path(key).read_bytes() == b"step 10"
        store.finish(key, status, metrics={"diverged_at": 3} if status == "diverged" else {})
        assert not store.resume_path(key).exists()
        assert not store.save_resume(key, b"after the end")  # a late one writes nothing either
    assert not store.save_resume("never-claimed", b"x")
    folder = store.resume_path("k").parent
    assert sorted(folder.iterdir()) == []  # no partial file left
    dead = folder / f"k.pt.{store_module._partial_tag(2**22 + 1)}.partial"  # a pid not alive
    dead.write_bytes(b"half")
    assert store.remove_dead_partials() == 1 and not dead.exists()


def test_a_run_resumes_a_cell_from_its_checkpoint_and_ignores_a_damaged_one(tmp_path, monkeypatch):
    path = one_cell(tmp_path, {"steps": 30, "eval_every": 5}, DROPOUT)
    (cell,) = load_grid(path).cells
    reference = train_cell(cell)
    points = []
    train_cell(cell, resume=ResumePlan(every_steps=20),
               on_checkpoint=lambda step, data: points.append(data))  # fmt: skip
    written = []
    real_save = ResultsStore.save_resume
    monkeypatch.setattr(ResultsStore, "save_resume",
                        lambda self, *a, **k: written.append(real_save(self, *a, **k)))  # fmt: skip
    flipped = bytearray(points[0])
    flipped[-1000] ^= 1  # a bit of the weights: torch.load alone would not notice
    ignored = "resume checkpoint ignored ({}); trained from step 0"
    cases = {
        "resumed": (points[0], "resumed from its checkpoint at step 20"),
        "garbage": (b"\x00 half-written", ignored.format("not an attn_zoo resume checkpoint")),
        "flipped": (bytes(flipped), ignored.format("damaged: its checksum does not match its "
                                                   "contents")),
    }  # fmt: skip
    for name, (data, note) in cases.items():
        spec = load_grid(path, ["resume.every_steps=10", f"store={tmp_path / name}.sqlite"])
        file = resume_file(spec, cell)
        file.parent.mkdir()
        file.write_bytes(data)
        out = io.StringIO()
        assert run_grid(spec, workers=1, out=out)["done"] == 1
        assert f"note: {cell_label(cell)}: {note}" in out.getvalue()
        (row,) = ResultsStore(spec.store, readonly=True).rows()
        assert row["curve"] == reference.curve
        assert exact(row["metrics"]) == exact(reference.metrics)
        assert row["environment"].get("resumed_from_step") == (20 if name == "resumed" else None)
        assert list(file.parent.iterdir()) == []  # removed when the cell finished
    # from step 20 no checkpoint was due (30 is the last step); from 0, at steps 10 and 20
    assert written == [True, True] * 2


def test_a_full_disk_under_the_resume_checkpoints_costs_one_line_not_the_run(tmp_path, monkeypatch):
    """Every resume checkpoint's partial file fails half-written with ENOSPC: one note for the
    run (not one per checkpoint), no partial file left, both cells done."""
    spec = load_grid(tiny_grid(tmp_path, seeds=[0, 1], mechanisms=[STD]), ["resume.every_steps=5"])
    folder = resume_file(spec, spec.cells[0]).parent
    real_write = Path.write_bytes

    def full_disk(self, data):
        if self.parent == folder:
            real_write(self, data[:100])
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    out = io.StringIO()
    assert run_grid(spec, workers=1, out=out) == {"done": 2, "failed": 0, "diverged": 0}
    notes = [line for line in out.getvalue().splitlines() if "cannot be written" in line]
    assert len(notes) == 1, out.getvalue()
    assert notes[0].startswith(f"note: resume checkpoint {folder}/")
    assert notes[0].endswith(
        ".partial' (the disk is full); this run takes no more, and its cells train on without them"
    )
    assert list(folder.iterdir()) == []  # the half-written partial file is gone


@pytest.mark.slow  # a CLI process: 10 s
def test_a_file_where_the_resume_folder_goes_costs_one_line_not_the_run(tmp_path):
    """`<store>.resume` is a regular file: no checkpoint can be written (nor read) there. The
    run says so once, trains its cells without checkpoints and exits 0; the file is left."""
    path = tiny_grid(tmp_path, seeds=[0, 1], mechanisms=[STD])
    spec = load_grid(path)
    squatter = resume_file(spec, spec.cells[0]).parent
    squatter.write_text("not a folder")
    command = [sys.executable, "-m", "ablations.cli", "ablate", "run", str(path), "--workers", "1",
               "--set", "resume.every_steps=5"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "Traceback" not in said, said
    notes = [line for line in said.splitlines() if line.startswith("note:")]
    assert notes == [
        f"note: resume checkpoint {resume_file(spec, spec.cells[0])} cannot be written: "
        f"{squatter} is a file, not a folder; this run takes no more, and its cells train on "
        "without them"
    ]
    rows = list(ResultsStore(spec.store, readonly=True).rows())
    assert [r["status"] for r in rows] == ["done", "done"]
    assert squatter.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml", "tiny.resume", "tiny.sqlite"]


def pinned() -> None:
    """In a child process: run on one core (one torch thread per worker, as `one_thread`)."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


@pytest.mark.slow  # two CLI runs, each spawning a worker process: 20 to 50 s
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_run_killed_with_sigkill_resumes_its_cell_from_the_checkpoint_on_disk(tmp_path):
    path = one_cell(tmp_path, {"steps": 300, "eval_every": 50}, DROPOUT)
    spec = load_grid(path)
    (cell,) = spec.cells
    file = resume_file(spec, cell)
    command = [sys.executable, "-m", "ablations.cli", "ablate", "run", str(path), "--workers", "2",
               "--set", "resume.every_steps=25"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (tmp_path / "first.txt").open("w") as out:  # a worker process trains the cell
        first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=pinned)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not file.exists():
            assert first.poll() is None and time.monotonic() < deadline, (
                tmp_path / "first.txt"
            ).read_text()
            time.sleep(0.02)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its worker, at once
        first.wait()
    assert [r["status"] for r in ResultsStore(spec.store, readonly=True).rows()] == ["running"]

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300, preexec_fn=pinned)  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr
    (row,) = ResultsStore(spec.store, readonly=True).rows()
    step = row["environment"]["resumed_from_step"]
    assert step % 25 == 0 and 25 <= step < 300
    assert f"note: {cell_label(cell)}: resumed from its checkpoint at step {step}" in second.stdout
    reference = train_cell(cell)  # uninterrupted, one thread
    assert row["status"] == "done" and row["curve"] == reference.curve
    assert exact(row["metrics"]) == exact(reference.metrics)
    assert list(file.parent.iterdir()) == []  # removed, no partial file left
