"""Executors: where a grid's cells train. The driver (ablations.run.runner) hands each one a cell
and gets its outcome back (ablations.run.train.CellOutcome); executors never write the store.

    pool = make_executor("local", workers=2)      # or "ray", address=..., resources=...
    handle = pool.submit(cell, keep_state=True, resume=plan)  # ablations.run.resume.ResumePlan
    for handle, outcome in pool.wait([handle], timeout=1.0): ...   # outcome: a CellOutcome
    for key, step, loss in pool.drain(): ...      # progress events of the running cells
    for point in pool.resume_points(): ...        # resume checkpoints they sent (drain takes
                                                  # them in): the driver writes them
    pool.close()                                  # ends every worker, within seconds

A cell submitted with `asks=True` (local executor only: a search's pruner, ablations.run.search)
waits at each evaluation after which it would train on for the driver's answer: it sends an
`Evaluation` (`pool.questions()`, taken in by drain) and goes on or stops as `pruned` as
`pool.answer(key, prune)` says.

`EXECUTORS`:
  local  `workers` spawned processes (default: as many as the usable cores hold), each cell
         with the grid's torch threads (`[resources]` num_cpus, default 1: held fixed, however
         many workers run); `workers=1` trains in a thread of the driver's own process. Where
         this machine has GPUs and the grid's device is "auto" or "cuda", worker i trains on
         cuda:i (more workers than GPUs share them round-robin: ablations.run.devices), and the
         default is one worker per GPU; otherwise every worker trains on the grid's device (CPU
         for "auto").
  ray    one `ray.remote` task per cell on the cluster at `address` (a local instance when
         None), asking for the grid's `[resources]` (`ray_options`: num_cpus, default 1, also
         its torch threads; num_gpus, default 0, fractions sharing a GPU), retried when its
         worker dies. Ray shows a task only the GPUs it was given, so "auto" trains on the GPU
         of a task with num_gpus > 0 and on the CPU otherwise; "cuda" needs num_gpus > 0.
         Ray is imported only here.

Every executor has `slots` (cells at once), `submit`, `wait`, `drain`, `resume_points`,
`questions`, `close` and `notes` (one-line messages for the driver to print); the local one
also `answer` and `kill` (SIGKILL every worker process, from a signal handler). Worker
processes ignore SIGINT (the driver decides) and exit when the driver dies, SIGKILL included.
A cell lost to the infrastructure rather than by its own error (a Ray task whose retries ran
out, a worker process killed by SIGKILL, SIGTERM, SIGINT or SIGHUP) comes back with status
`LOST`: the driver releases it, and the next run trains it again.
"""

from __future__ import annotations

import contextlib
import io
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_connections

import torch

from ablations.grid.cell import Cell, training_settings
from ablations.grid.plugins import import_plugins
from ablations.results.store import error_summary
from ablations.run.devices import (
    RESOURCE_DEFAULTS,
    attempted_device,
    cell_threads,
    default_local_workers,
    gpu_count,
    local_placement,
    ray_device_problem,
    usable_cpus,
)
from ablations.run.resume import ResumePlan, ResumePoint
from ablations.run.train import LOST, CellOutcome, environment, train_cell

EXECUTORS = ("local", "ray")
DRAIN_EVERY = 0.25  # seconds between two drains of Ray's progress queue
# A worker process killed by these was killed from outside (the OOM killer, a user, a shutdown):
# its cell is lost, not failed. Other deaths (SIGSEGV, SIGABRT, an exit) are the cell's failure.
KILLED_FROM_OUTSIDE = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class CellInterrupted(BaseException):
    """Raised in a training thread (by its progress report or a module call) when the run is
    stopping; not an Exception, so `run_cell` does not record it as the cell's failure."""


@dataclass(frozen=True)
class Evaluation:
    """A cell's question to the driver at an evaluation: should it stop here (pruned)?"""

    key: str
    step: int
    val_loss: float
    val_metric: float


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def run_cell(
    cell: Cell,
    threads: int,
    progress=None,
    keep_state: bool = False,
    device: str | None = None,
    imports: Sequence[str] = (),
    resume: ResumePlan | None = None,
    ask=None,
) -> CellOutcome:
    """Train `cell` here with `threads` torch threads, on `device` (the GPU an executor placed
    it on; default: the cell's device resolved here), after importing the grid's plugins
    (`imports`, ablations.grid.plugins: once per process); never raises. With `ask`, the cell calls
    `ask(Evaluation(...))` at each evaluation after which it would train on, and stops there as
    `pruned` when it returns true (ablations.run.train.train_cell's `should_prune`).

    With `keep_state` (a grid that keeps checkpoints) the outcome carries the trained weights
    and, for a finished cell, the attention maps of the trained model
    (`ablations.run.train.attention_record`), and why recording them failed if it did.
    `progress.put((key, step, loss))` is called at each evaluation when a queue is given, and
    `progress.put(ResumePoint(...))` with each resume checkpoint `resume` asks for (and the
    cell starts from its checkpoint, if any: ablations.run.resume); best-effort: a put that fails
    ends the reporting, never the cell. `CellInterrupted` (not an Exception) passes through."""
    torch.set_num_threads(threads)
    key = cell.key

    def send(item) -> None:
        nonlocal progress
        if progress is None:
            return
        try:
            progress.put(item)
        except Exception:  # the progress channel is gone (a dead Ray actor): train on without
            progress = None

    placed = {} if device is None else {"device": device}
    if ask is not None:
        placed["should_prune"] = lambda step, loss, metric: ask(Evaluation(key, step, loss, metric))
    try:
        import_plugins(imports)
        result = train_cell(
            cell,
            on_progress=lambda step, loss: send((key, step, loss)),
            keep_state=keep_state,
            keep_maps=keep_state,
            **placed,
            resume=resume,
            on_checkpoint=lambda step, data: send(ResumePoint(key, step, data)),
        )
    except Exception:
        setting = training_settings(cell.training)["device"]
        where = environment(attempted_device(setting, device))
        return CellOutcome("failed", where, error=traceback.format_exc())
    outcome = CellOutcome(result.status, result.environment, result.metrics, result.curve)
    outcome.notes = result.notes
    if result.state is not None:
        outcome.state = _saved(result.state)
    if result.maps is not None:
        outcome.maps = _saved(result.maps)
        if result.maps.get("error"):
            outcome.maps_error = error_summary(result.maps["error"])
    return outcome


# Local executor -------------------------------------------------------------------------------

STOP_GRACE = 5.0  # seconds a stopped worker gets to end before it is killed (or left, a thread)


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


def _given(device: str | None, resume: ResumePlan | None, ask=None) -> dict:
    """The keyword arguments of run_cell that an executor gives only when set: a device when
    it placed the cell on a GPU, a resume plan when the driver gave one, `ask` when the cell
    asks whether to stop."""
    given = {} if device is None else {"device": device}
    given.update({k: v for k, v in (("resume", resume), ("ask", ask)) if v is not None})
    return given


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
    given = _given(device, resume, progress.ask if asks else None)
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


class _ResumePoints:
    """What an executor does with the resume checkpoints (`ResumePoint`) and questions
    (`Evaluation`) that come up its progress channel: keeps them for `resume_points` and
    `questions`."""

    points: list[ResumePoint]
    asked: list[Evaluation]

    def _progress_only(self, events: list) -> list:
        """`events` without its resume checkpoints and questions, which are kept."""
        self.points += [event for event in events if isinstance(event, ResumePoint)]
        self.asked += [event for event in events if isinstance(event, Evaluation)]
        return [event for event in events if not isinstance(event, ResumePoint | Evaluation)]

    def questions(self) -> list[Evaluation]:
        """The questions of cells that wait for `answer` (`drain` takes them in)."""
        asked, self.asked = self.asked, []
        return asked

    def resume_points(self) -> list[ResumePoint]:
        """The resume checkpoints that came up since the last call (`drain` takes them in)."""
        points, self.points = self.points, []
        return points


class LocalExecutor(_ResumePoints):
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
        return local_placement(worker.index, self.gpus, training_settings(cell.training)["device"])

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


# Ray executor ---------------------------------------------------------------------------------


def ray_options(resources: dict | None = None, retries: int = 3) -> dict:
    """The `.options(...)` of each cell's Ray task: the grid's `[resources]` (num_cpus,
    num_gpus; defaults `RESOURCE_DEFAULTS`) and `max_retries`."""
    resources = {**RESOURCE_DEFAULTS, **(resources or {})}
    return dict(num_cpus=resources["num_cpus"], num_gpus=resources["num_gpus"], max_retries=retries)


def ray_slots(cluster: dict, options: dict) -> int:
    """Cells at once on a Ray cluster with `cluster` resources, each task asking `options`
    (`ray_options`): as many as its CPUs and, when a cell asks for GPUs, its GPUs hold."""
    slots = cluster.get("CPU", 1) // options["num_cpus"]
    if options["num_gpus"]:
        slots = min(slots, cluster.get("GPU", 0) // options["num_gpus"])
    return max(1, int(slots))


class RayExecutor(_ResumePoints):
    """Cells as `ray.remote` tasks asking for `ray_options(resources)` (default 1 CPU and 1
    torch thread, no GPU; up to `retries` retries when the worker dies); progress through a
    Ray queue, best-effort; outcomes come back to the driver. A local instance started here
    (with `workers` x num_cpus CPUs) is shut down by `close`. SpecError before any cell
    runs when the grid's device is "cuda"/"cuda:N" and num_gpus is 0 (Ray would hide every GPU
    from the task), or when a local instance has fewer GPUs than one cell asks for."""

    def __init__(
        self,
        workers: int | None,
        address: str | None,
        retries: int = 3,
        resources: dict | None = None,
        device: str = "auto",
        imports: Sequence[str] = (),
    ):
        self.options = ray_options(resources, retries)
        self.imports = list(imports)
        cpus, gpus = self.options["num_cpus"], self.options["num_gpus"]
        from ablations.grid.spec import SpecError  # the driver's: workers need no grid schema

        problem = ray_device_problem(device, gpus)
        if problem:
            raise SpecError(problem)
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
            local = {}
            if not address:
                local["num_cpus"] = math.ceil(workers * cpus) if workers else usable_cpus()
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, **local)
            except Exception as err:
                if not address:
                    raise
                raise SpecError(
                    f"--address {address}: cannot connect to the Ray cluster: "
                    f"{' '.join(f'{type(err).__name__}: {err}'.split())[:300]}. A cluster started "
                    "with token authentication (`ray start --head` turns it on where "
                    "~/.ray/auth_token exists) needs RAY_AUTH_MODE=token (and RAY_AUTH_TOKEN, "
                    "or that file) in this process's environment"
                ) from None
        self.notes: list[str] = []
        cluster = ray.cluster_resources()
        if gpus > cluster.get("GPU", 0):
            have = f"the Ray cluster has {cluster.get('GPU', 0):g} GPUs"
            if self.started and not address:
                ray.shutdown()
                raise SpecError(f"resources.num_gpus = {gpus:g} but {have}")
            self.notes.append(f"resources.num_gpus = {gpus:g} but {have} now: cells wait for one")
        self.slots = workers or ray_slots(cluster, self.options)
        self.threads = max(1, int(cpus))
        self.progress = Queue()
        self.drained = 0.0  # when drain last asked the queue
        self.points: list[ResumePoint] = []
        self.asked: list[Evaluation] = []
        self.task = ray.remote(run_cell)
        self.in_flight: set = set()

    def submit(
        self, cell: Cell, keep_state: bool, resume: ResumePlan | None = None, asks: bool = False
    ):
        if asks:
            raise ValueError("a cell that asks whether to stop (asks=True) needs executor='local'")
        ref = self.task.options(**self.options).remote(
            cell, self.threads, self.progress, keep_state, None, self.imports,
            **_given(None, resume),
        )  # fmt: skip
        self.in_flight.add(ref)
        return ref

    def wait(self, handles: list, timeout: float) -> list[tuple[object, CellOutcome]]:
        if not handles:
            return []
        ready, rest = self.ray.wait(handles, num_returns=1, timeout=timeout)
        if ready and rest:  # and every other one already done: one pass records them all
            ready += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        out = []
        for ref in ready:
            self.in_flight.discard(ref)
            try:
                out.append((ref, self.ray.get(ref)))
            except Exception:  # run_cell never raises: Ray lost the task (retries exhausted)
                out.append((ref, CellOutcome(LOST, error=traceback.format_exc())))
        return out

    def drain(self) -> list[tuple[str, int, float]]:
        """The progress reports queued since the last drain; at most every `DRAIN_EVERY`
        seconds (each drain is two calls to the queue actor)."""
        if self.progress is None or time.monotonic() - self.drained < DRAIN_EVERY:
            return []
        self.drained = time.monotonic()
        try:
            return self._progress_only(self.progress.get_nowait_batch(self.progress.qsize()))
        except Exception as err:  # the queue actor died: no more progress lines, cells go on
            self.progress = None
            self.notes.append(
                f"progress channel lost ({type(err).__name__}); cells go on without progress "
                "lines or resume checkpoints"
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


def make_executor(
    name: str,
    workers: int | None = None,
    address: str | None = None,
    resources: dict | None = None,
    device: str = "auto",
    imports: Sequence[str] = (),
):
    """The executor `name` (one of `EXECUTORS`) for a grid whose `training.device` is
    `device`, whose `[resources]` are `resources` (Ray) and whose plugins `imports` (every
    worker imports them); ValueError naming the valid ones.
    The local executor's default `workers`: one per GPU where the cells train on this
    machine's GPUs, else as many as the cores it may use hold (ablations.run.devices.
    default_local_workers); each trains with the grid's torch threads (`[resources]`
    num_cpus, default 1: ablations.run.devices.cell_threads), whatever the number of workers."""
    if workers is not None and workers < 1:
        raise ValueError(f"workers={workers}: must be >= 1")
    if name == "local":
        if address is not None:
            raise ValueError(f"address={address!r} is for executor='ray', not 'local'")
        threads = cell_threads(resources)
        workers = workers or default_local_workers(device, threads)
        return LocalExecutor(workers, imports=imports, threads=threads)
    if name == "ray":
        return RayExecutor(workers, address, resources=resources, device=device, imports=imports)
    raise ValueError(f"executor={name!r} is not valid; valid: {', '.join(EXECUTORS)}")
