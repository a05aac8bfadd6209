"""Running a grid: every unfinished cell trained once; only the driver writes the store.

    spec = load_grid("ablations/grids/demo.toml")
    counts = run_grid(spec, executor="local", workers=2)   # {"done": 18, "failed": 0, ...}

The driver takes the grid's cells (expanded once, when it loaded), smoke-tests each kind of cell
(`check_cells`), refuses in one line when finished cells of the grid in its store were made from
other data files or plugins than this run's (ablations.run.provenance), opens the grid's
`ResultsStore` and trains the cells that `ablate status` shows
as todo or running (a claim, perhaps of a dead run: claiming decides) and, with `retry_failed`,
failed: see `cells_to_train`. It claims a cell when it hands it to a worker
(ablations.run.executors) and records its outcome when it comes back: a failing cell as `failed`
with its traceback, a NaN/inf loss as `diverged` at its step; the grid goes on either way. In a
grid that keeps checkpoints, the cell's weights (`ResultsStore.checkpoint_path`) and the
attention maps its worker recorded on the trained model (`ResultsStore.maps_path`, drawn by
ablations.report.attention_maps) are written with its record, only while this run holds its claim. A
run killed at any point (SIGKILL included) loses no finished cell, and running the grid again
trains only the cells that never finished. A full disk, a file-size limit or a damaged store
stops the run in one line (`RunStopped`), the cells in flight released. What it shows meanwhile:
ablations.run.progress (a live view on a terminal, plain lines elsewhere).

`run_grid` hands its cells to `drive`, the driver loop itself, in one batch; a search
(ablations.run.search) hands it one round of trials after another on one executor, and answers the
questions of cells that ask whether to stop at an evaluation (its pruner): such a cell is
recorded as `pruned`, a final outcome.

Stopping: while cells train, SIGINT (Ctrl-C) or SIGTERM stops the run within seconds: the
workers are ended (processes terminated, the training thread stopped at its next module call,
Ray tasks cancelled), the cells in flight are released for the next run, a one-line summary is
printed and `GridInterrupted` raised (exit code 130 or 143 from the CLI). A second signal during
that shutdown exits at once, but for the same signal within `REPEAT_S` of the first: coreutils
`timeout` sends its SIGTERM twice (to the run, then to its process group), which is one stop.
Losing Ray's progress channel only stops the progress display. A cell lost to the
infrastructure rather than by its own error (`ablations.run.train.LOST`) is released, not recorded:
the next run trains it again.

Resuming: a cell that trains long enough hands the driver resume checkpoints (the grid's
`[resume]`, ablations.run.resume), written beside the store (`ResultsStore.resume_path`) only while
this run holds its claim; a cell interrupted (its run killed or stopped, its worker lost)
starts from its last one when it runs again, and ends as if it had not been. A resume
checkpoint that cannot be written (a full disk, a file where their folder goes) costs one line:
the run takes no more, and its cells train on without them.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ablations.grid.cell import Cell
from ablations.grid.spec import GridSpec, SpecError
from ablations.results.store import ClaimError, ResultsStore, StoreError, config_key
from ablations.results.tracking import TrackingPlan, check_backends, open_trackers
from ablations.run.cell_worker import Evaluation
from ablations.run.devices import (
    cell_threads,
    default_local_workers,
    slow_precision,
    usable_cpus,
)
from ablations.run.executors import make_executor
from ablations.run.progress import COUNTED, Progress, cell_label, make_progress
from ablations.run.provenance import mixed_provenance, plugin_record, source_state
from ablations.run.resume import ResumePlan, ResumePoint
from ablations.run.status import grid_status
from ablations.run.train import LOST, CellOutcome, smoke_test
from ablations.tasks.registry import TASKS
from attn_zoo.mechanisms.registry import MECHANISMS
from attn_zoo.models.positional import POSITIONAL
from attn_zoo.symbols import SYMBOL_RETRIEVERS


class GridInterrupted(KeyboardInterrupt, SystemExit):
    """`run_grid` stopped by SIGINT or SIGTERM: the cells in flight were released. A
    KeyboardInterrupt for callers, and a SystemExit whose code is 128 + the signal number
    (130, 143), so the CLI exits with it, without a traceback. `summary` is the line printed;
    `counts` the outcomes recorded before the stop."""

    def __init__(self, signum: int, summary: str, counts: dict[str, int]):
        super().__init__(summary)
        self.code = 128 + signum
        self.signum, self.summary, self.counts = signum, summary, counts


def check_cells(spec: GridSpec) -> None:
    """`smoke_test` every model of the grid (task, size with its model options, mechanism with
    its kwargs) once, before any training; SpecError naming the file, the labels and the
    error."""
    seen = set()
    for cell in spec.cells:
        model = config_key(
            {k: v for k, v in cell.config().items() if k not in ("training", "seed")}
        )
        if model in seen:
            continue
        seen.add(model)
        try:
            smoke_test(cell)
        except Exception as err:
            raise SpecError(
                f"{spec.path}: mechanism {cell.mechanism!r} (name {cell.mechanism_name!r}, "
                f"kwargs {cell.mechanism_kwargs}) with size {cell.size['label']!r} (model "
                f"{cell.size}) on task "
                f"{cell.task!r} cannot train: {type(err).__name__}: {err}"
            ) from err


def cells_to_train(spec: GridSpec, retry_failed: bool = False) -> list[Cell]:
    """The cells of `spec` a run trains, in grid order: those whose status (`grid_status`, as
    `ablate status` shows it) is todo, stale or running (claiming one decides whether its run is
    still alive), and failed ones with `retry_failed`; done, diverged and pruned cells never."""
    wanted = {"todo", "stale", "running"} | ({"failed"} if retry_failed else set())
    frame = grid_status(spec)
    status = dict(zip(frame["key"], frame["status"], strict=True))
    return [cell for cell in spec.cells if status[cell.key] in wanted]


def kept_files(store: ResultsStore, key: str, outcome: CellOutcome) -> dict[Path, bytes]:
    """The files `outcome` brings (torch.save bytes) by where they go beside the store: the
    trained weights at `checkpoint_path(key)`, the attention maps at `maps_path(key)`."""
    files = {store.checkpoint_path(key): outcome.state, store.maps_path(key): outcome.maps}
    return {path: data for path, data in files.items() if data is not None}


def resume_plan(
    spec: GridSpec, store: ResultsStore, key: str, progress: Progress, sources: dict | None = None
) -> ResumePlan:
    """When cell `key` takes resume checkpoints (the grid's `[resume]`) and the one it starts
    from: the bytes of its resume file, if any (one that cannot be read is noted, not used);
    `sources`: the run's code and plugins, which its checkpoints hold (`ResumePlan.sources`)."""
    path = store.resume_path(key)
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # none; a file where the folder goes
        data = None
    except OSError as err:
        progress.note(f"resume checkpoint {path} cannot be read ({err}); trained from step 0")
        data = None
    every = spec.resume
    return ResumePlan(every["every_steps"], 60.0 * every["every_minutes"], data, sources)


STORAGE_HINTS = {  # what an OSError writing the store's files means, in the stop line
    errno.ENOSPC: " (the disk is full)",
    errno.EFBIG: " (a file-size limit: ulimit -f)",
    errno.EDQUOT: " (the disk quota is used up)",
}


class RunStopped(RuntimeError):
    """`run_grid` stopped because its store or the disk under it failed (a full disk, a
    file-size limit, a damaged store): the cells in flight were released where the store
    allowed it, no partial file is left, and running the grid again resumes. Its message is
    the one line printed."""


def run_grid(
    spec: GridSpec,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    retry_failed: bool = False,
    interval: float = 10.0,
    out: TextIO | None = None,
    tracking: TrackingPlan | None = None,
) -> dict[str, int]:
    """Check, then train every unfinished cell of `spec` (and the failed ones again with
    `retry_failed`) and record it; the counts of this run's outcomes by status. `interval`:
    seconds between status lines when `out` (default: sys.stdout as it is at the call) is not a
    terminal. `tracking`: the trackers each recorded cell is then copied to (default: the
    grid's [tracking]; ablations.results.tracking)."""
    if spec.search is not None:
        raise SpecError(
            f"{spec.path}: a grid with [search] runs with ablations.run.search.run_search"
        )
    tracking = spec.tracking if tracking is None else tracking
    check_backends(tracking)  # a missing package: TrackingError before anything runs
    check_cells(spec)
    ResultsStore(spec.store).close()  # created first: another run may be creating it now
    todo = cells_to_train(spec, retry_failed)
    batches = [todo]  # one batch: every cell to train

    def feed(say: Callable[[str], None]) -> list[Cell]:
        if batches:
            say(f"grid {spec.name!r}: {len(spec.cells)} cells, {len(spec.cells) - len(todo)} "
                f"already finished, {len(todo)} to run; store {spec.store}")  # fmt: skip
        return batches.pop() if batches else []

    run = dict(executor=executor, workers=workers, address=address, retry_failed=retry_failed)
    return drive(spec, feed, spec.cells, len(spec.cells) - len(todo), interval, out, tracking,
                 **run)  # fmt: skip


Feed = Callable[[Callable[[str], None]], list[Cell]]  # drive's source of cells: see drive
Judge = Callable[[Evaluation], bool]  # whether a cell that asks stops there (pruned)


@dataclass
class _Run:
    """A run in progress, one step of the driver loop at a time: `submit` claims cells and hands
    them to the executor, `collect` records the outcomes that came back, `tend` keeps the rest
    going (claims, progress, questions, resume checkpoints), `shut_down` ends the workers and
    gives the cells in flight back."""

    spec: GridSpec
    store: ResultsStore
    pool: object
    progress: Progress
    stop: _StopSignals
    trackers: object
    environment: dict  # what every recorded cell's environment gets: the commit, the plugins
    sources: dict  # the code and plugins, once per run: the workers' checkpoints hold them
    retry_failed: bool = False
    judge: Judge | None = None
    running: dict = field(default_factory=dict)  # executor handle -> its cell
    claimed: set = field(default_factory=set)  # claims of this run not yet finished or released
    released: int = 0  # claims given back unfinished
    resume_off: bool = False  # a resume checkpoint could not be written: the run takes no more
    beat: float = field(default_factory=time.monotonic)

    def submit(self, todo: list[Cell]) -> None:
        """Claim the next cells of `todo` while the executor has a free slot, and hand each to
        it with its resume plan; a cell finished meanwhile or held by another live run is
        skipped."""
        while todo and len(self.running) < self.pool.slots and self.stop.signum is None:
            cell = todo.pop(0)
            if self.store.claim(cell.config(), retry_failed=self.retry_failed) is None:
                self.progress.skipped(cell)  # finished meanwhile, or held by another live run
                continue
            self.claimed.add(cell.key)
            plan = resume_plan(self.spec, self.store, cell.key, self.progress, self.sources)
            if self.resume_off:  # takes none
                plan = dataclasses.replace(plan, every_steps=0, every_seconds=0.0)
            asks = self.judge is not None  # its evaluations wait for the judge
            self.running[self.pool.submit(cell, self.spec.checkpoints, plan, asks=asks)] = cell
            self.progress.started(cell.key, cell)

    def collect(self) -> None:
        """Record each outcome that came back within a second: a lost cell released for the
        next run, any other finished into the store (with its files) and copied to the
        trackers."""
        for handle, outcome in self.pool.wait(list(self.running), timeout=1.0):
            cell = self.running.pop(handle)
            key = cell.key
            if outcome.status == LOST:  # not the cell's doing: the next run retries it
                self.released += self.store.release(key)
                self.claimed.discard(key)
                self.progress.released(key, outcome.error)
                continue
            outcome.environment = {**outcome.environment, **self.environment}
            if outcome.maps_error:  # the cell is kept; its report says the map is missing
                self.progress.note(
                    f"{cell_label(cell)}: attention maps not recorded: {outcome.maps_error}"
                )
            for note in outcome.notes:  # e.g. resumed from its checkpoint at step N
                self.progress.note(f"{cell_label(cell)}: {note}")
            files = kept_files(self.store, key, outcome)
            try:
                self.store.finish(key, **outcome.record(), files=files)
            except ClaimError as err:  # our claim went stale and another run took it
                self.claimed.discard(key)
                self.progress.dropped(key, err)
                continue
            self.claimed.discard(key)
            self.progress.finished(key, outcome)
            for warning in self.trackers.log(cell_label(cell), cell.config(), outcome.record()):
                self.progress.print(warning)  # the cell is stored: tracking is a copy

    def tend(self) -> None:
        """The rest of one loop: renew this run's claims (every quarter lease), show the
        progress reports, answer the cells that ask whether to stop, write their resume
        checkpoints, print the executor's notes."""
        if time.monotonic() - self.beat >= self.store.lease / 4:
            self.store.heartbeat(self.claimed)
            self.beat = time.monotonic()
        for key, step, loss in self.pool.drain():
            self.progress.step(key, step, loss)
        for question in self.pool.questions():  # cells waiting at an evaluation
            self.pool.answer(question.key, self.judge(question))
        for point in self.pool.resume_points():  # written only while this run holds the claim
            self.resume_off = self.resume_off or not _save_resume(self.store, point, self.progress)
        _print_notes(self.pool, self.progress)
        self.progress.tick()

    def shut_down(self) -> None:
        """End every worker (what was in flight is discarded) and release the cells in flight
        for any run (a claim that cannot be released goes stale when this process ends);
        the signal handlers put back."""
        if self.stop.signum is not None:
            self.progress.print(
                f"{signal.Signals(self.stop.signum).name}: stopping the workers and releasing "
                "the cells in flight (Ctrl-C again to exit at once)"
            )
        try:
            self.pool.close()
        finally:
            unreleased = 0
            for key in self.claimed:
                try:
                    self.released += self.store.release(key)
                except Exception:  # its claim goes stale when this process ends
                    unreleased += 1
            if unreleased:
                self.progress.print(
                    f"{unreleased} cells in flight could not be released; their claims go "
                    "stale when this run ends, and the next run takes them over"
                )
            self.stop.restore()
        _print_notes(self.pool, self.progress)


def drive(
    spec: GridSpec,
    feed: Feed,
    named: list[Cell],
    finished: int,
    interval: float,
    out: TextIO | None,
    tracking: TrackingPlan,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    retry_failed: bool = False,
    judge: Judge | None = None,
) -> dict[str, int]:
    """Train and record the cells `feed(say)` returns, batch after batch, until it returns
    none: it is called when nothing is training (first before any worker starts: none then, no
    worker), `say` printing a line where the progress display allows; one store, executor,
    set of trackers and progress display for the whole run (`_Run`: claim and submit, collect,
    tend, shut down). `named`: cells whose names workers must import (`_check_importable`);
    `finished`: cells of the grid finished before the run (the progress counts them). With
    `judge`, each cell asks at its evaluations whether to stop (`Evaluation`,
    ablations.run.cell_worker) and stops as `pruned` where `judge` says so. The counts of this
    run's outcomes by status (with pruned where there is a judge). `out`: where lines go (None:
    sys.stdout as it is at the call, not at import)."""
    out = sys.stdout if out is None else out
    plugins = plugin_record(spec.imports)
    store = ResultsStore(spec.store)
    mixed = mixed_provenance(spec.cells, store, plugins)
    if mixed is not None:
        store.close()
        raise SpecError(f"{spec.path}: {mixed}")
    store.record_axes(spec.name, spec.axes())  # read back by the report (results/axes.py)
    store.remove_dead_partials()

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    todo = feed(say)
    counted = dict.fromkeys(COUNTED + (("pruned",) if judge else ()), 0)
    if not todo:
        store.close()
        return counted
    warn_slow = _slow_warning(executor)
    warn_slow(todo, say)
    try:
        trackers = open_trackers(tracking, spec.name, spec.store)
    except BaseException:
        store.close()
        raise
    stop = _StopSignals()  # before ray.init, which sets its own SIGTERM handler
    device = spec.training.device  # where the local workers go
    threads = cell_threads(spec.resources)
    local = None if executor == "ray" else workers or default_local_workers(device, threads)
    sources = {"code": source_state(), "plugins": plugins}  # ResumePlan.sources
    environment = {**sources["code"], "plugins": plugins}
    if local is not None:  # cells timed side by side: contended where workers x threads > cpus
        environment.update(workers=local, cpus=usable_cpus())
    if executor == "ray" or local > 1:
        _check_importable(spec, named)  # before any worker starts
    pool = make_executor(executor, workers, address, spec.resources, device, spec.imports)
    stop.install(pool)
    try:
        progress = make_progress([], finished, pool.slots, interval, out)
    except BaseException:
        stop.restore()
        pool.close()
        raise
    progress.counts.update(counted)  # pruned, where cells may be
    progress.expect(todo)
    stop.progress = progress
    run = _Run(spec, store, pool, progress, stop, trackers, environment, sources, retry_failed,
               judge)  # fmt: skip
    fault: Exception | None = None  # what stopped the run, when its store or disk failed
    try:
        while stop.signum is None:
            if not todo and not run.running:
                todo = feed(progress.print)
                if not todo:
                    break
                warn_slow(todo, progress.print)
                progress.expect(todo)
            run.submit(todo)
            run.collect()
            run.tend()
    except KeyboardInterrupt:  # not through the handler (it was not installed, or replaced)
        stop.signum = stop.signum or signal.SIGINT
    except (OSError, StoreError) as err:  # the disk is full, a file-size limit, a broken store
        fault = err
    finally:
        try:
            run.shut_down()
        finally:
            progress.close()
            store.close()
    done, left = sum(progress.counts.values()), len(todo)
    if fault is not None:
        hint = STORAGE_HINTS.get(getattr(fault, "errno", None), "")
        summary = (
            f"stopped: {' '.join(f'{type(fault).__name__}: {fault}'.split())}{hint}; "
            f"{done} finished, {run.released} released, {left} not started; free space (or "
            "mend the store) and run again to resume"
        )
        progress.print(summary)
        raise RunStopped(summary)
    if stop.signum is not None:
        summary = (
            f"interrupted ({signal.Signals(stop.signum).name}): {done} finished, "
            f"{run.released} released, {left} not started; run again to resume"
        )
        progress.print(summary)
        raise GridInterrupted(stop.signum, summary, progress.counts)
    progress.print(progress.status_line())
    return progress.counts


def _slow_warning(executor: str) -> Callable[[list[Cell], Callable[[str], None]], None]:
    """A function printing a warning line (with the given printer) for each new (precision,
    device) of the cells it is given that trains slowly on this machine (`slow_precision`),
    each pair once per run; local runs only: Ray's machines may differ."""
    warned: set[tuple[str, str]] = set()  # the (precision, device) pairs checked so far

    def warn(cells: list[Cell], print_line: Callable[[str], None]) -> None:
        if executor != "local":
            return
        for cell in cells:
            pair = (cell.training.precision, cell.training.device)
            slow = None if pair in warned else slow_precision(*pair)
            warned.add(pair)
            if slow is not None:
                print_line(f"warning: {slow}")

    return warn


def _check_importable(spec: GridSpec, cells: list[Cell]) -> None:
    """SpecError when a name of the grid (a mechanism, task, symbol retriever or positional
    encoding) is defined in the script that runs it (module __main__): other worker processes
    cannot import a script, so they would fail every cell with an unknown name."""
    names = set()
    for cell in cells:
        names |= {("mechanism", MECHANISMS, cell.mechanism_name), ("task", TASKS, cell.task_name)}
        for options in (cell.size, cell.mechanism_kwargs):
            if isinstance(options.get("symbol_retrieval"), str):
                names.add(("symbol_retrieval", SYMBOL_RETRIEVERS, options["symbol_retrieval"]))
            if isinstance(options.get("pos_enc"), str):
                names.add(("pos_enc", POSITIONAL, options["pos_enc"]))
    for kind, registry, name in sorted(names, key=str):
        if name in registry and getattr(registry[name], "__module__", "") == "__main__":
            raise SpecError(
                f"{spec.path}: {kind} {name!r} is defined in the script that runs the grid "
                "(__main__), which worker processes cannot import: move it into a module and "
                "name that module in the grid's imports = [...] (or --import), or run the grid "
                "with workers=1 (one worker trains in this process)"
            )


def _save_resume(store: ResultsStore, point: ResumePoint, progress: Progress) -> bool:
    """Write `point` beside the store (`ResultsStore.save_resume`); False, after one note
    naming the file and the reason, when the disk refuses it (the cells train on without
    checkpoints)."""
    try:
        store.save_resume(point.key, point.data)
        return True
    except OSError as err:
        path = store.resume_path(point.key)
        reason = f"{type(err).__name__}: {err}{STORAGE_HINTS.get(err.errno, '')}"
        if path.parent.exists() and not path.parent.is_dir():
            reason = f"{path.parent} is a file, not a folder"
        progress.note(
            f"resume checkpoint {path} cannot be written: {reason}; this run takes no more, "
            "and its cells train on without them"
        )
        return False


def _print_notes(pool, progress: Progress) -> None:
    notes = getattr(pool, "notes", [])
    while notes:
        progress.note(notes.pop(0))


REPEAT_S = 1.0  # the same signal again within this many seconds of the first: one stop


class _StopSignals:
    """SIGINT and SIGTERM while the driver runs cells (main thread only): the first sets
    `signum`, which ends the driver loop; a second one (not the first's signal again within
    `REPEAT_S`) exits at once (os._exit), after killing the worker processes and giving the
    terminal back from a live progress display (`progress`, once set). `restore` puts back the
    handlers there were when it was made."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.pool = None
        self.progress: Progress | None = None
        self.signum: int | None = None
        self.since = 0.0  # time.monotonic() of the first signal
        self.main = threading.current_thread() is threading.main_thread()
        self.previous = {signum: signal.getsignal(signum) for signum in self.SIGNALS}

    def install(self, pool) -> None:
        self.pool = pool
        if self.main:
            for signum in self.SIGNALS:
                signal.signal(signum, self.handle)

    def handle(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum, self.since = signum, time.monotonic()
            return
        if signum == self.signum and time.monotonic() - self.since < REPEAT_S:
            return  # the same stop delivered twice (coreutils timeout), not a second one
        try:
            if self.progress is not None:
                self.progress.abandon()
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
