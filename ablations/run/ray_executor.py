"""The Ray executor: one `ray.remote` task per cell on a Ray cluster (a local instance when no
address is given), asking for the grid's `[resources]`; see executors.py. Ray is imported only
here, when the executor is made."""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from collections.abc import Sequence

from ablations.grid.cell import Cell
from ablations.run.cell_worker import Evaluation, ResumePoints, run_cell, run_cell_options
from ablations.run.devices import RESOURCE_DEFAULTS, ray_device_problem, usable_cpus
from ablations.run.resume import ResumePlan, ResumePoint
from ablations.run.train import LOST, CellOutcome

DRAIN_EVERY = 0.25  # seconds between two drains of Ray's progress queue


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


class RayExecutor(ResumePoints):
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
            **run_cell_options(None, resume),
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
