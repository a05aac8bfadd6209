"""Running a grid: every unfinished cell trained once; only the driver writes the store.

    spec = load_grid("ablations/grids/demo.toml")
    counts = run_grid(spec, executor="local", workers=2)   # {"done": 18, "failed": 0, ...}

The driver opens the grid's `ResultsStore`, skips the cells already finished (done, failed or
diverged), marks a cell `running` when it hands it to a worker and records its outcome when it
comes back: a failing cell as `failed` with its traceback, a NaN/inf loss as `diverged` at its
step; the grid goes on either way. A run killed at any point (SIGKILL included) loses no
finished cell, and running the grid again trains only the cells that never finished.

Executors (`EXECUTORS`):
  local  `workers` spawned processes, the machine's cores split between them as torch threads;
         `workers=1` trains in a thread of the driver's own process.
  ray    one `ray.remote` task per cell on the cluster at `address` (a local instance when
         None), one CPU each, retried when its worker dies. Ray is imported only here.

Stopping: while cells train, SIGINT (Ctrl-C) or SIGTERM stops the run within seconds: the
workers are ended (processes terminated, the training thread stopped at its next module call,
Ray tasks cancelled), the cells in flight are released for the next run, a one-line summary is
printed and `GridInterrupted` raised (exit code 130 or 143 from the CLI). A second signal during
that shutdown exits at once. Worker processes ignore SIGINT (the driver decides) and exit when
the driver dies, SIGKILL included. Losing Ray's progress channel only stops the progress lines.
A cell lost to the infrastructure rather than by its own error (a Ray task whose retries ran
out, a worker process killed by SIGKILL, SIGTERM, SIGINT or SIGHUP) is released, not recorded:
the next run trains it again.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from multiprocessing.connection import wait as wait_connections
from pathlib import Path

import torch

from ablations.spec import Cell, GridSpec, SpecError
from ablations.store import FINISHED, ClaimError, ResultsStore, config_key, error_summary
from ablations.train import environment, smoke_test, train_cell

EXECUTORS = ("local", "ray")
LOST = "lost"  # no cell's result (Ray lost the task, a worker was killed): released, not recorded
# A worker process killed by these was killed from outside (the OOM killer, a user, a shutdown):
# its cell is lost, not failed. Other deaths (SIGSEGV, SIGABRT, an exit) are the cell's failure.
KILLED_FROM_OUTSIDE = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class CellInterrupted(BaseException):
    """Raised in a training thread (by its progress report or a module call) when the run is
    stopping; not an Exception, so `run_cell` does not record it as the cell's failure."""


class GridInterrupted(KeyboardInterrupt, SystemExit):
    """`run_grid` stopped by SIGINT or SIGTERM: the cells in flight were released. A
    KeyboardInterrupt for callers, and a SystemExit whose code is 128 + the signal number
    (130, 143), so the CLI exits with it, without a traceback. `summary` is the line printed;
    `counts` the outcomes recorded before the stop."""

    def __init__(self, signum: int, summary: str, counts: dict[str, int]):
        super().__init__(summary)
        self.code = 128 + signum
        self.signum, self.summary, self.counts = signum, summary, counts


def run_cell(config: dict, threads: int, progress=None, keep_state: bool = False) -> dict:
    """Train the cell of `config` here with `threads` torch threads; never raises.

    Returns the outcome as keyword arguments of `ResultsStore.finish`, plus "state" (the
    trained weights as torch.save bytes) with `keep_state`. `progress.put((key, step, loss))`
    is called at each evaluation when a queue is given, best-effort: a put that fails ends the
    reporting, never the cell. `CellInterrupted` (not an Exception) passes through."""
    torch.set_num_threads(threads)
    key = config_key(config)

    def report(step: int, loss: float) -> None:
        nonlocal progress
        if progress is None:
            return
        try:
            progress.put((key, step, loss))
        except Exception:  # the progress channel is gone (a dead Ray actor): train on without
            progress = None

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

STOP_GRACE = 5.0  # seconds a stopped worker gets to end before it is killed (or left, a thread)


class _PipeProgress:
    """`put` sends a progress event up a worker's pipe (run_cell's `progress`)."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, item) -> None:
        self.conn.send(("progress", item))


class _ThreadProgress(_PipeProgress):
    """The thread worker's progress: raises `CellInterrupted` once the run is stopping."""

    def __init__(self, conn, stop: threading.Event):
        super().__init__(conn)
        self.stop = stop

    def put(self, item) -> None:
        if self.stop.is_set():
            raise CellInterrupted
        super().put(item)


def _train_in_thread(conn, config: dict, threads: int, keep_state: bool, stop) -> None:
    try:
        outcome = run_cell(config, threads, _ThreadProgress(conn, stop), keep_state)
    except CellInterrupted:
        return
    except BaseException:  # run_cell catches Exception; the driver must still hear back
        outcome = dict(status="failed", environment=environment(), error=traceback.format_exc())
    with contextlib.suppress(OSError):  # the driver closed the pipe: it is stopping
        conn.send(("outcome", outcome))


def _exit_with_parent(parent: int) -> None:
    """Poll the parent: once it has died (SIGKILL included), end this worker process."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _worker_main(conn, threads: int, parent: int) -> None:
    """A spawned worker process: train the cells sent down `conn` until None or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the driver, which decides
    if hasattr(signal, "pthread_sigmask"):  # blocked by the driver while it started us
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    progress = _PipeProgress(conn)
    while True:
        try:
            job = conn.recv()
            if job is None:
                return
            outcome = run_cell(job[0], threads, progress, job[1])
            conn.send(("outcome", outcome))
        except (EOFError, OSError):  # the driver is gone
            return


class _Worker:
    """One slot of a LocalExecutor: a spawned process, or (process=False) a thread of this
    process per cell, and the pipe its progress events and outcome come back on."""

    def __init__(self, threads: int, process: bool):
        self.threads = threads
        self.busy = False
        self.outcome: dict | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.process = None
        if process:
            context = mp.get_context("spawn")
            self.conn, child = context.Pipe()
            self.process = context.Process(
                target=_worker_main, args=(child, threads, os.getpid()), daemon=True
            )
            masked = hasattr(signal, "pthread_sigmask")
            if masked:  # the child starts with SIGINT blocked until it ignores it
                from multiprocessing import resource_tracker

                resource_tracker.ensure_running()  # starting it later would unblock SIGINT
                old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                self.process.start()
            finally:
                if masked:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)
            child.close()
            self.child = None
        else:
            self.conn, self.child = mp.Pipe()

    def alive(self) -> bool:
        return self.process.is_alive() if self.process else True

    def start(self, config: dict, keep_state: bool) -> None:
        self.busy, self.outcome = True, None
        if self.process:
            self.conn.send((config, keep_state))
        else:
            self.thread = threading.Thread(
                target=_train_in_thread,
                args=(self.child, config, self.threads, keep_state, self.stop),
                name="attn-zoo-cell",
                daemon=True,  # never joined at exit: a stopped run does not wait for it
            )
            self.thread.start()

    def read(self, events: list) -> None:
        """Take what has come up the pipe: progress into `events`, the outcome into
        `self.outcome`; a process that died with its cell gives a failed outcome."""
        try:
            while self.conn.poll():
                kind, payload = self.conn.recv()
                if kind == "progress":
                    events.append(payload)
                else:
                    self.outcome = payload
        except (EOFError, OSError):
            pass
        if self.busy and self.outcome is None and not self.alive():
            code = self.process.exitcode or 0
            killed = -code in KILLED_FROM_OUTSIDE  # the OOM killer, a user, a shutdown
            how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
            self.outcome = dict(
                status=LOST if killed else "failed",
                error=f"WorkerDied: worker process {self.process.pid} died ({how}) while "
                "training this cell" + (" (out of memory?)" if -code == signal.SIGKILL else ""),
            )

    def end(self) -> None:
        """Stop this worker without waiting: terminate its process (an idle one is asked to
        exit), or ask its thread to stop at its next progress report or module call."""
        self.stop.set()
        if self.process:
            try:
                if self.busy:
                    self.process.terminate()
                else:
                    self.conn.send(None)
            except (OSError, ValueError):
                pass

    def kill(self) -> None:
        if self.process and self.process.pid and self.process.exitcode is None:
            with contextlib.suppress(OSError):
                os.kill(self.process.pid, signal.SIGKILL)


class LocalExecutor:
    """`workers` spawned processes with cpu_count // workers torch threads each (one worker:
    a thread of this process, which keeps the driver free to show progress). Handles are the
    workers themselves; progress and outcomes come up one pipe per worker."""

    def __init__(self, workers: int):
        self.slots = workers
        self.threads = max(1, (os.cpu_count() or 1) // workers)
        self.processes = workers > 1
        self.workers: list[_Worker] = []
        self.events: list[tuple[str, int, float]] = []
        self.notes: list[str] = []

    def submit(self, config: dict, keep_state: bool) -> _Worker:
        for worker in list(self.workers):
            if not worker.busy and not worker.alive():  # died idle: start a fresh one
                self._drop(worker)
        idle = [worker for worker in self.workers if not worker.busy]
        if idle:
            try:
                idle[0].start(config, keep_state)
                return idle[0]
            except OSError:  # it died idle just now
                self._drop(idle[0])
        worker = _Worker(self.threads, self.processes)
        self.workers.append(worker)
        worker.start(config, keep_state)
        return worker

    def wait(self, handles: list, timeout: float) -> list[tuple[object, dict]]:
        """(worker, outcome) of the handles whose cell has come back (or whose process died
        with it), waiting up to `timeout` seconds for one."""
        if not any(worker.outcome is not None for worker in handles) and handles:
            waitable = {worker.conn: worker for worker in handles}
            waitable.update({w.process.sentinel: w for w in handles if w.process})
            for ready in wait_connections(list(waitable), timeout):
                waitable[ready].read(self.events)
        out = []
        for worker in handles:
            if worker.outcome is not None:
                out.append((worker, worker.outcome))
                worker.busy, worker.outcome = False, None
                if not worker.alive():
                    self._drop(worker)
        return out

    def _drop(self, worker: _Worker) -> None:
        self.workers.remove(worker)
        worker.conn.close()

    def drain(self) -> list[tuple[str, int, float]]:
        for worker in self.workers:
            if worker.busy:
                worker.read(self.events)
        events, self.events = self.events, []
        return events

    def close(self) -> None:
        """End every worker within STOP_GRACE seconds: processes are terminated (killed when
        they outlive it), training threads stopped at their next module call or report."""
        hook = None
        threads = {w.thread.ident for w in self.workers if w.thread and w.thread.is_alive()}
        if threads:

            def stop_thread(module, args):
                if threading.get_ident() in threads:
                    raise CellInterrupted

            hook = torch.nn.modules.module.register_module_forward_pre_hook(stop_thread)
        for worker in self.workers:
            worker.end()
        deadline = time.monotonic() + STOP_GRACE
        try:
            for worker in self.workers:
                if worker.process:
                    worker.process.join(max(0.0, deadline - time.monotonic()))
                    if worker.process.exitcode is None:
                        worker.kill()
                        worker.process.join(1.0)
                elif worker.thread:
                    worker.conn.close()  # unblocks a thread sending its outcome
                    worker.thread.join(max(0.0, deadline - time.monotonic()))
                    if worker.thread.is_alive():
                        self.notes.append(
                            f"the training thread did not stop within {STOP_GRACE:.0f} s; "
                            "it ends with this process"
                        )
        finally:
            if hook is not None:
                hook.remove()
            for worker in self.workers:
                worker.conn.close()
                if worker.child is not None and not (worker.thread and worker.thread.is_alive()):
                    worker.child.close()
            self.workers = []

    def kill(self) -> None:
        """At once, from a signal handler: SIGKILL every worker process."""
        for worker in list(self.workers):
            worker.kill()


# Ray executor ---------------------------------------------------------------------------------


class RayExecutor:
    """Cells as `ray.remote` tasks (1 CPU, 1 torch thread, up to `retries` retries when the
    worker dies); progress through a Ray queue, best-effort; outcomes come back to the driver.
    A local instance started here is shut down by `close`."""

    def __init__(self, workers: int | None, address: str | None, retries: int = 3):
        try:
            import ray
            from ray.util.queue import Queue
        except ImportError as err:
            raise RuntimeError(
                "executor='ray' needs Ray, which is not installed: pip install 'attn_zoo[ray]'"
            ) from err
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            local = {} if address else {"num_cpus": workers or os.cpu_count()}
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **local)
        self.slots = workers or int(ray.cluster_resources().get("CPU", 1))
        self.progress = Queue()
        self.task = ray.remote(num_cpus=1, max_retries=retries)(run_cell)
        self.in_flight: set = set()
        self.notes: list[str] = []

    def submit(self, config: dict, keep_state: bool):
        ref = self.task.remote(config, 1, self.progress, keep_state)
        self.in_flight.add(ref)
        return ref

    def wait(self, handles: list, timeout: float) -> list[tuple[object, dict]]:
        if not handles:
            return []
        ready, _ = self.ray.wait(handles, num_returns=1, timeout=timeout)
        out = []
        for ref in ready:
            self.in_flight.discard(ref)
            try:
                out.append((ref, self.ray.get(ref)))
            except Exception:  # run_cell never raises: Ray lost the task (retries exhausted)
                out.append((ref, dict(status=LOST, error=traceback.format_exc())))
        return out

    def drain(self) -> list[tuple[str, int, float]]:
        if self.progress is None:
            return []
        try:
            return self.progress.get_nowait_batch(self.progress.qsize())
        except Exception as err:  # the queue actor died: no more progress lines, cells go on
            self.progress = None
            self.notes.append(
                f"progress channel lost ({type(err).__name__}); cells go on without progress"
            )
            return []

    def close(self) -> None:
        """Cancel the tasks in flight (their workers killed), drop the progress queue, shut
        down a local instance started here."""
        for ref in self.in_flight:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)
        self.in_flight.clear()
        try:
            if self.progress is not None:
                self.progress.shutdown(force=True)
        except Exception:
            pass
        if self.started:
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
    commit = source_commit()
    stop = _StopSignals()  # before ray.init, which sets its own SIGTERM handler
    pool = make_executor(executor, workers, address)
    stop.install(pool)
    progress = Progress(todo, len(cells), pool.slots, interval, out)
    running: dict[object, tuple[str, Cell]] = {}
    claimed: set[str] = set()  # claims of this run not yet finished or released
    released = 0  # claims given back unfinished
    beat = time.monotonic()
    try:
        while (todo or running) and stop.signum is None:
            while todo and len(running) < pool.slots and stop.signum is None:
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
                key, cell = running.pop(handle)
                if outcome["status"] == LOST:  # not the cell's doing: the next run retries it
                    released += store.release(key)
                    claimed.discard(key)
                    progress.running.pop(key, None)
                    progress.print(
                        f"released {cell_label(cell)}: {error_summary(outcome.get('error'))} "
                        "(lost by the executor, not the cell's error; the next run trains it)"
                    )
                    continue
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
            _print_notes(pool, progress)
            progress.tick()
    except KeyboardInterrupt:  # not through the handler (it was not installed, or replaced)
        stop.signum = stop.signum or signal.SIGINT
    finally:
        if stop.signum is not None:
            progress.print(
                f"{signal.Signals(stop.signum).name}: stopping the workers and releasing the "
                "cells in flight (Ctrl-C again to exit at once)"
            )
        try:
            pool.close()  # ends every worker: what was in flight is discarded
        finally:
            for key in claimed:  # give the cells in flight back to any run
                try:
                    released += store.release(key)
                except Exception as err:  # its claim goes stale when this process ends
                    progress.print(f"could not release cell {key}: {err}")
            stop.restore()
        _print_notes(pool, progress)
    if stop.signum is not None:
        summary = (
            f"interrupted ({signal.Signals(stop.signum).name}): "
            f"{sum(progress.counts.values())} finished, {released} released, "
            f"{len(todo)} not started; run again to resume"
        )
        progress.print(summary)
        raise GridInterrupted(stop.signum, summary, progress.counts)
    progress.print(progress.status_line())
    return progress.counts


def _print_notes(pool, progress: Progress) -> None:
    notes = getattr(pool, "notes", [])
    while notes:
        progress.print(f"note: {notes.pop(0)}")


class _StopSignals:
    """SIGINT and SIGTERM while the driver runs cells (main thread only): the first sets
    `signum`, which ends the driver loop; a second one exits at once (os._exit), after killing
    the worker processes. `restore` puts back the handlers there were when it was made."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.pool = None
        self.signum: int | None = None
        self.main = threading.current_thread() is threading.main_thread()
        self.previous = {signum: signal.getsignal(signum) for signum in self.SIGNALS}

    def install(self, pool) -> None:
        self.pool = pool
        if self.main:
            for signum in self.SIGNALS:
                signal.signal(signum, self.handle)

    def handle(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            return
        try:
            name = signal.Signals(signum).name
            os.write(
                2,
                f"\n{name} again: exiting now; cells in flight stay claimed by this "
                "dead run, which the next run takes over\n".encode(),
            )
            kill = getattr(self.pool, "kill", None)
            if kill is not None:
                kill()
        finally:
            os._exit(128 + signum)

    def restore(self) -> None:
        if self.main:
            for signum, handler in self.previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
