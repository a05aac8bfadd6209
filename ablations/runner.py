"""Running a grid: every unfinished cell trained once; only the driver writes the store.

    spec = load_grid("ablations/grids/demo.toml")
    counts = run_grid(spec, executor="local", workers=2)   # {"done": 18, "failed": 0, ...}

The driver opens the grid's `ResultsStore`, skips the cells already finished (done, failed or
diverged), marks a cell `running` when it hands it to a worker and records its outcome when it
comes back: a failing cell as `failed` with its traceback, a NaN/inf loss as `diverged` at its
step; the grid goes on either way. A run killed at any point (SIGKILL included) loses no
finished cell, and running the grid again trains only the cells that never finished.

Executors (`EXECUTORS`):
  local  a pool of `workers` spawned processes, the machine's cores split between them as torch
         threads; `workers=1` trains in a thread of the driver's own process.
  ray    one `ray.remote` task per cell on the cluster at `address` (a local instance when
         None), one CPU each, retried when its worker dies. Ray is imported only here.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from ablations.spec import Cell, GridSpec, SpecError
from ablations.store import FINISHED, ClaimError, ResultsStore, config_key, error_summary
from ablations.train import environment, smoke_test, train_cell

EXECUTORS = ("local", "ray")


def run_cell(config: dict, threads: int, progress=None, keep_state: bool = False) -> dict:
    """Train the cell of `config` here with `threads` torch threads; never raises.

    Returns the outcome as keyword arguments of `ResultsStore.finish`, plus "state" (the
    trained weights as torch.save bytes) with `keep_state`. `progress.put((key, step, loss))`
    is called at each evaluation when a queue is given."""
    torch.set_num_threads(threads)
    key = config_key(config)

    def report(step: int, loss: float) -> None:
        if progress is not None:
            progress.put((key, step, loss))

    try:
        result = train_cell(Cell(**config), on_progress=report, keep_state=keep_state)
    except Exception:
        return dict(status="failed", environment=environment(), error=traceback.format_exc())
    outcome = dict(
        status=result.status,
        metrics=result.metrics,
        curve=result.curve,
        environment=result.environment,
    )
    if result.state is not None:
        buffer = io.BytesIO()
        torch.save(result.state, buffer)
        outcome["state"] = buffer.getvalue()
    return outcome


def source_commit() -> str:
    """The git commit of this source tree (+ "-dirty" with local changes), or "unknown"."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


# Local executor -------------------------------------------------------------------------------

_WORKER_PROGRESS = None


def _init_worker(progress) -> None:
    global _WORKER_PROGRESS
    _WORKER_PROGRESS = progress


def _pool_cell(config: dict, threads: int, keep_state: bool) -> dict:
    return run_cell(config, threads, _WORKER_PROGRESS, keep_state)


class LocalExecutor:
    """`workers` spawned processes with cpu_count // workers torch threads each (one worker:
    a thread of this process, which keeps the driver free to show progress)."""

    def __init__(self, workers: int):
        self.slots = workers
        self.threads = max(1, (os.cpu_count() or 1) // workers)
        if workers == 1:
            self.progress = queue.Queue()
            self.pool = ThreadPoolExecutor(1)
        else:
            self.progress = mp.get_context("spawn").Queue()
            self.pool = self._process_pool()

    def _process_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.slots,
            mp_context=mp.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.progress,),
        )

    def submit(self, config: dict, keep_state: bool) -> Future:
        if isinstance(self.pool, ThreadPoolExecutor):
            return self.pool.submit(run_cell, config, self.threads, self.progress, keep_state)
        try:
            return self.pool.submit(_pool_cell, config, self.threads, keep_state)
        except BrokenProcessPool:  # a worker died earlier: start a fresh pool
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = self._process_pool()
            return self.pool.submit(_pool_cell, config, self.threads, keep_state)

    def wait(self, handles: list, timeout: float) -> list[tuple[object, dict]]:
        finished, _ = wait_futures(handles, timeout=timeout, return_when=FIRST_COMPLETED)
        out = []
        for future in finished:
            try:
                out.append((future, future.result()))
            except BrokenProcessPool:  # a worker process died (killed, out of memory)
                out.append((future, dict(status="failed", error=traceback.format_exc())))
        return out

    def drain(self) -> list[tuple[str, int, float]]:
        events = []
        while True:
            try:
                events.append(self.progress.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


# Ray executor ---------------------------------------------------------------------------------


class RayExecutor:
    """Cells as `ray.remote` tasks (1 CPU, 1 torch thread, up to `retries` retries when the
    worker dies); progress through a Ray queue; outcomes come back to the driver."""

    def __init__(self, workers: int | None, address: str | None, retries: int = 3):
        try:
            import ray
            from ray.util.queue import Queue
        except ImportError as err:
            raise RuntimeError(
                "executor='ray' needs Ray, which is not installed: pip install 'attn_zoo[ray]'"
            ) from err
        self.ray = ray
        if not ray.is_initialized():
            local = {} if address else {"num_cpus": workers or os.cpu_count()}
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **local)
        self.slots = workers or int(ray.cluster_resources().get("CPU", 1))
        self.progress = Queue()
        self.task = ray.remote(num_cpus=1, max_retries=retries)(run_cell)

    def submit(self, config: dict, keep_state: bool):
        return self.task.remote(config, 1, self.progress, keep_state)

    def wait(self, handles: list, timeout: float) -> list[tuple[object, dict]]:
        ready, _ = self.ray.wait(handles, num_returns=1, timeout=timeout)
        out = []
        for ref in ready:
            try:
                out.append((ref, self.ray.get(ref)))
            except Exception:  # retries exhausted, or the task could not run
                out.append((ref, dict(status="failed", error=traceback.format_exc())))
        return out

    def drain(self) -> list[tuple[str, int, float]]:
        return self.progress.get_nowait_batch(self.progress.qsize())

    def close(self) -> None:
        self.progress.shutdown()
        self.ray.shutdown()


def make_executor(name: str, workers: int | None = None, address: str | None = None):
    """The executor `name` (one of `EXECUTORS`); ValueError naming the valid ones."""
    if workers is not None and workers < 1:
        raise ValueError(f"workers={workers}: must be >= 1")
    if name == "local":
        if address is not None:
            raise ValueError(f"address={address!r} is for executor='ray', not 'local'")
        return LocalExecutor(workers or os.cpu_count() or 1)
    if name == "ray":
        return RayExecutor(workers, address)
    raise ValueError(f"executor={name!r} is not valid; valid: {', '.join(EXECUTORS)}")


# Progress display -----------------------------------------------------------------------------


def cell_label(cell: Cell) -> str:
    return f"{cell.task}/{cell.size['label']}/{cell.mechanism}/seed{cell.seed}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _kind(cell: Cell) -> tuple[str, str, str]:
    return (cell.task, cell.size["label"], cell.mechanism)


class Progress:
    """Prints each finished cell, and every `interval` seconds a line with the cells done,
    running, failed and diverged, the ETA, and each running cell's step and loss.

    The ETA sums each unfinished cell's expected time (the mean of finished cells of its
    task, size and mechanism; else of its task; else of all), less the running cells' time
    so far, over the worker slots."""

    def __init__(self, todo: list[Cell], total: int, slots: int, interval: float, out=sys.stdout):
        self.total, self.already = total, total - len(todo)
        self.slots, self.interval, self.out = slots, interval, out
        self.pending = Counter(_kind(cell) for cell in todo)
        self.counts = dict.fromkeys(FINISHED, 0)
        self.running: dict[str, list] = {}  # key -> [label, kind, started, step, loss]
        self.durations: dict[tuple, list[float]] = {}
        self.last = time.monotonic()

    def print(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def started(self, key: str, cell: Cell) -> None:
        self.pending[_kind(cell)] -= 1
        self.running[key] = [cell_label(cell), _kind(cell), time.monotonic(), 0, float("nan")]

    def step(self, key: str, step: int, loss: float) -> None:
        if key in self.running:
            self.running[key][3:] = [step, loss]

    def finished(self, key: str, outcome: dict) -> None:
        label, kind, started, *_ = self.running.pop(key)
        seconds = time.monotonic() - started
        self.durations.setdefault(kind, []).append(seconds)
        status = outcome["status"]
        self.counts[status] += 1
        metrics = outcome.get("metrics") or {}
        if status == "done":
            what = f"test_acc {metrics['test_acc']:.3f} in {metrics['steps']} steps"
        elif status == "diverged":
            what = f"at step {metrics['diverged_at']}"
        else:
            what = error_summary(outcome.get("error"))
        self.print(f"{status:8s} {label}: {what} ({_duration(seconds)})")

    def expected(self, kind: tuple) -> float | None:
        """Mean seconds of finished cells like `kind`: same kind, else same task, else any."""
        for like in (lambda k: k == kind, lambda k: k[0] == kind[0], lambda k: True):
            times = [t for k, ts in self.durations.items() if like(k) for t in ts]
            if times:
                return sum(times) / len(times)
        return None

    def eta(self) -> str:
        if not self.durations or not (self.running or sum(self.pending.values())):
            return "-"
        now = time.monotonic()
        left = sum(self.expected(kind) * n for kind, n in self.pending.items() if n)
        left += sum(max(0.0, self.expected(r[1]) - (now - r[2])) for r in self.running.values())
        return _duration(left / self.slots)

    def status_line(self) -> str:
        done = self.already + sum(self.counts.values())
        running = "; ".join(
            f"{label} step {step} loss {loss:.3f}" if step else f"{label} starting"
            for label, _, _, step, loss in self.running.values()
        )
        return (
            f"[{done}/{self.total} finished, {len(self.running)} running, "
            f"{self.counts['failed']} failed, {self.counts['diverged']} diverged, "
            f"ETA {self.eta()}] {running}"
        )

    def tick(self) -> None:
        if time.monotonic() - self.last >= self.interval:
            self.last = time.monotonic()
            self.print(self.status_line())


def check_cells(spec: GridSpec) -> None:
    """`smoke_test` every (task, size, mechanism) of the grid once, before any training;
    SpecError naming the file, the labels and the error."""
    seen = set()
    for cell in spec.cells():
        labels = (cell.task, cell.size["label"], cell.mechanism)
        if labels in seen:
            continue
        seen.add(labels)
        try:
            smoke_test(cell)
        except Exception as err:
            raise SpecError(
                f"{spec.path}: mechanism {cell.mechanism!r} (name {cell.mechanism_name!r}, "
                f"kwargs {cell.mechanism_kwargs}) with size {cell.size['label']!r} on task "
                f"{cell.task!r} cannot train: {type(err).__name__}: {err}"
            ) from err


def run_grid(
    spec: GridSpec,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    retry_failed: bool = False,
    interval: float = 10.0,
    out=sys.stdout,
) -> dict[str, int]:
    """Check, then train every unfinished cell of `spec` (and the failed ones again with
    `retry_failed`) and record it; the counts of this run's outcomes by status."""
    check_cells(spec)
    store = ResultsStore(spec.store)
    cells = spec.cells()
    finished = store.finished_keys(("done", "diverged") if retry_failed else FINISHED)
    todo = [cell for cell in cells if config_key(cell.config()) not in finished]
    print(
        f"grid {spec.name!r}: {len(cells)} cells, {len(cells) - len(todo)} already finished, "
        f"{len(todo)} to run; store {spec.store}",
        file=out,
        flush=True,
    )
    if not todo:
        return dict.fromkeys(FINISHED, 0)
    pool = make_executor(executor, workers, address)
    progress = Progress(todo, len(cells), pool.slots, interval, out)
    commit = source_commit()
    running: dict[object, tuple[str, Cell]] = {}
    claimed: set[str] = set()  # claims of this run not yet finished or released
    beat = time.monotonic()
    try:
        while todo or running:
            while todo and len(running) < pool.slots:
                cell = todo.pop(0)
                key = store.claim(cell.config(), retry_failed=retry_failed)
                if key is None:  # finished meanwhile, or being trained by another live run
                    progress.pending[_kind(cell)] -= 1
                    progress.print(f"skipped  {cell_label(cell)}: finished or held by another run")
                    continue
                claimed.add(key)
                running[pool.submit(cell.config(), spec.checkpoints)] = (key, cell)
                progress.started(key, cell)
            for handle, outcome in pool.wait(list(running), timeout=1.0):
                key, _ = running.pop(handle)
                outcome["environment"] = dict(outcome.get("environment") or {}, commit=commit)
                if "state" in outcome:
                    store.save_checkpoint(key, outcome.pop("state"))
                try:
                    store.finish(key, **outcome)
                except ClaimError as err:  # our claim went stale and another run took it
                    claimed.discard(key)
                    progress.running.pop(key, None)
                    progress.print(f"dropped: {err}")
                    continue
                claimed.discard(key)
                progress.finished(key, outcome)
            if time.monotonic() - beat >= store.lease / 4:
                store.heartbeat(claimed)
                beat = time.monotonic()
            for key, step, loss in pool.drain():
                progress.step(key, step, loss)
            progress.tick()
    finally:
        pool.close()
        for key in claimed:  # interrupted: give the cells in flight back to any run
            store.release(key)
    progress.print(progress.status_line())
    return progress.counts
