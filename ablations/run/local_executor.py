"""The local executor: cells trained by spawned worker processes on this machine (one worker:
a thread of the driver's process), each with the grid's torch threads; see executors.py."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import wait as wait_connections

import torch

from ablations.grid.cell import Cell
from ablations.run.cell_worker import (
    CellInterrupted,
    Evaluation,
    ResumePoints,
    run_cell,
    run_cell_options,
)
from ablations.run.devices import gpu_count, local_placement
from ablations.run.resume import ResumePlan, ResumePoint
from ablations.run.train import LOST, CellOutcome, environment

STOP_GRACE = 5.0  # seconds a stopped worker gets to end before it is killed (or left, a thread)


# A worker process killed by these was killed from outside (the OOM killer, a user, a shutdown):
# its cell is lost, not failed. Other deaths (SIGSEGV, SIGABRT, an exit) are the cell's failure.
KILLED_FROM_OUTSIDE = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class _PipeProgress:
    """`put` sends a progress event up a worker's pipe (run_cell's `progress`); `ask` sends an
    `Evaluation` and waits for the driver's answer (run_cell's `ask`)."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, item) -> None:
        self.conn.send(("progress", item))

    def ask(self, evaluation: Evaluation) -> bool:
        self.conn.send(("ask", evaluation))
        return self.conn.recv()


class _ThreadProgress(_PipeProgress):
    """The thread worker's progress: raises `CellInterrupted` once the run is stopping."""

    def __init__(self, conn, stop: threading.Event):
        super().__init__(conn)
        self.stop = stop

    def put(self, item) -> None:
        if self.stop.is_set():
            raise CellInterrupted
        super().put(item)

    def ask(self, evaluation: Evaluation) -> bool:
        if self.stop.is_set():
            raise CellInterrupted
        try:
            return super().ask(evaluation)
        except (EOFError, OSError):  # the driver closed the pipe: it is stopping
            raise CellInterrupted from None


def _run(
    cell: Cell,
    threads: int,
    progress: _PipeProgress,
    keep_state: bool,
    device: str | None,
    imports: Sequence[str],
    resume: ResumePlan | None,
    asks: bool,
) -> CellOutcome:
    given = run_cell_options(device, resume, progress.ask if asks else None)
    return run_cell(cell, threads, progress, keep_state, imports=imports, **given)


def _train_in_thread(
    conn, cell: Cell, threads: int, keep_state: bool, device, stop, resume, asks: bool
) -> None:
    try:  # the driver's process: its plugins are imported
        progress = _ThreadProgress(conn, stop)
        outcome = _run(cell, threads, progress, keep_state, device, (), resume, asks)
    except CellInterrupted:
        return
    except BaseException:  # run_cell catches Exception; the driver must still hear back
        outcome = CellOutcome("failed", environment(), error=traceback.format_exc())
    with contextlib.suppress(OSError):  # the driver closed the pipe: it is stopping
        conn.send(("outcome", outcome))


def _exit_with_parent(parent: int) -> None:
    """Poll the parent: once it has died (SIGKILL included), end this worker process."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _worker_main(conn, threads: int, parent: int, imports: Sequence[str]) -> None:
    """A spawned worker process: train the cells sent down `conn` until None or EOF, the
    grid's plugins (`imports`) imported before the first."""
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
            cell, keep_state, device, resume, asks = job
            outcome = _run(cell, threads, progress, keep_state, device, imports, resume, asks)
            conn.send(("outcome", outcome))
        except (EOFError, OSError):  # the driver is gone
            return


class _Worker:
    """One slot of a LocalExecutor: a spawned process, or (process=False) a thread of this
    process per cell, and the pipe its progress events and outcome come back on; `index`
    places it (`placement`)."""

    def __init__(self, threads: int, process: bool, index: int = 0, imports: Sequence[str] = ()):
        self.threads = threads
        self.index = index
        self.key: str | None = None  # the cell it trains
        self.busy = False
        self.outcome: CellOutcome | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.process = None
        if process:
            context = mp.get_context("spawn")
            self.conn, child = context.Pipe()
            self.process = context.Process(
                target=_worker_main, args=(child, threads, os.getpid(), imports), daemon=True
            )
            masked = hasattr(signal, "pthread_sigmask")
            if masked:  # the child starts with SIGINT blocked until it ignores it
                from multiprocessing import resource_tracker

                resource_tracker.ensure_running()  # starting it later would unblock SIGINT
                old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                with _without_main_script():
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

    def start(
        self,
        cell: Cell,
        keep_state: bool,
        device: str | None,
        resume: ResumePlan | None,
        asks: bool = False,
    ) -> None:
        self.busy, self.outcome, self.key = True, None, cell.key
        if self.process:
            self.conn.send((cell, keep_state, device, resume, asks))
        else:
            self.thread = threading.Thread(
                target=_train_in_thread,
                args=(self.child, cell, self.threads, keep_state, device, self.stop, resume, asks),
                name="attn-zoo-cell",
                daemon=True,  # never joined at exit: a stopped run does not wait for it
            )
            self.thread.start()

    def read(self, events: list) -> None:
        """Take what has come up the pipe: progress and questions into `events`, the outcome
        into `self.outcome`; a process that died with its cell gives a failed outcome."""
        try:
            while self.conn.poll():
                kind, payload = self.conn.recv()
                if kind in ("progress", "ask"):
                    events.append(payload)
                else:
                    self.outcome = payload
        except (EOFError, OSError):
            pass
        if self.busy and self.outcome is None and not self.alive():
            code = self.process.exitcode or 0
            killed = -code in KILLED_FROM_OUTSIDE  # the OOM killer, a user, a shutdown
            how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
            self.outcome = CellOutcome(
                LOST if killed else "failed",
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


@contextlib.contextmanager
def _without_main_script():
    """While a worker process starts: this process's __main__ (a user's script, perhaps without
    an ``if __name__ == "__main__":`` guard) hidden from multiprocessing's spawn, which would
    run the script again in the worker. What a worker needs of a script are its plugins,
    imported by name (ablations.grid.plugins)."""
    main = sys.modules["__main__"]
    saved = {
        name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__
    }
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


class LocalExecutor(ResumePoints):
    """`workers` spawned processes with `threads` torch threads each (the grid's, held fixed:
    ablations.run.devices.cell_threads; one worker: a thread of this process, which keeps the
    driver free to show progress), worker i on
    `placement(i, gpus, the cell's device)`. Handles are the workers themselves; progress and
    outcomes come up one pipe per worker."""

    def __init__(
        self, workers: int, gpus: int | None = None, imports: Sequence[str] = (), threads: int = 1
    ):
        self.slots = workers
        self.imports = list(imports)
        self.gpus = gpu_count() if gpus is None else gpus
        self.threads = threads
        self.processes = workers > 1
        self.workers: list[_Worker] = []
        self.events: list[tuple[str, int, float]] = []
        self.points: list[ResumePoint] = []
        self.asked: list[Evaluation] = []
        self.notes: list[str] = []

    def submit(
        self, cell: Cell, keep_state: bool, resume: ResumePlan | None = None, asks: bool = False
    ) -> _Worker:
        for worker in list(self.workers):
            if not worker.busy and not worker.alive():  # died idle: start a fresh one
                self._drop(worker)
        idle = [worker for worker in self.workers if not worker.busy]
        if idle:
            try:
                idle[0].start(cell, keep_state, self._device(idle[0], cell), resume, asks)
                return idle[0]
            except OSError:  # it died idle just now
                self._drop(idle[0])
        taken = {worker.index for worker in self.workers}
        index = min(i for i in range(len(self.workers) + 1) if i not in taken)
        worker = _Worker(self.threads, self.processes, index, self.imports)
        self.workers.append(worker)
        worker.start(cell, keep_state, self._device(worker, cell), resume, asks)
        return worker

    def answer(self, key: str, prune: bool) -> None:
        """Tell cell `key`, waiting at an evaluation (`questions`), to stop (`prune`) or go
        on; nothing where its worker is gone."""
        for worker in self.workers:
            if worker.busy and worker.key == key:
                with contextlib.suppress(OSError):
                    worker.conn.send(prune)

    def _device(self, worker: _Worker, cell: Cell) -> str | None:
        """The GPU `worker` trains `cell` on, or None where the cell's own device setting
        decides (ablations.run.devices.local_placement)."""
        return local_placement(worker.index, self.gpus, cell.training.device)

    def wait(self, handles: list, timeout: float) -> list[tuple[object, CellOutcome]]:
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
        return self._progress_only(events)

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
