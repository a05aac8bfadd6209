"""Executors: where a grid's cells train (local_executor.py, ray_executor.py; what a worker runs
for one cell: cell_worker.py). The driver (ablations.run.runner) hands each one a cell
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

from collections.abc import Sequence

from ablations.run.devices import cell_threads, default_local_workers
from ablations.run.local_executor import LocalExecutor
from ablations.run.ray_executor import RayExecutor

EXECUTORS = ("local", "ray")


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
