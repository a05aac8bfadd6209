"""What the grid driver costs per cell: grids of tiny cells (milliseconds each) run through
`run_grid` in this process, with the local executor and with Ray, and the results store alone.

    python -m ablations.bench.engine_overhead --cells 100 500
    RAY_AUTH_MODE=token python -m ablations.bench.engine_overhead --cells 500 --address HOST:PORT

(`RAY_AUTH_MODE=token` where the cluster of `ray start --head` uses token authentication, as
Ray 2.60 does once ~/.ray/auth_token exists: a driver that names an address uses it only when
told to.) Prints markdown tables:

- per run: the wall time from `run_grid` to its return, split into startup (checks, store,
  executor; until the first claim), the first cell (workers starting), and the steady part
  (first cell finished -> last cell finished). Over the steady part: cells per second, the
  cells' own training time (`metrics.wall_s`, the training loop), the overhead per cell (steady
  wall per cell minus the cells' training time over the slots: scheduling, store writes, the
  worker's task and model building and test evaluation, process and IPC overhead), and the
  driver's CPU time per cell (this process, all its threads; Ray's core worker included). The
  driver alone saturates at about 1000 / (driver CPU ms per cell) cells per second.
- `run_cell` in this process on the first cells, one torch thread: everything a worker does
  for a cell, without any executor.
- the store alone: `claim` then `finish` of N cells (one SQLite transaction each), per cell.

With `--report FOLDER` it also writes what it printed there: runs.csv, run_cell.csv, store.csv,
and report.md and index.html naming the machine, the date and the command (`make
engine-overhead` writes reports/engine_overhead/, which docs/grids.md's numbers cite).
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

CELL_TRAINING = {"steps": 1, "eval_every": 1, "batch_size": 4, "warmup_steps": 1}


def write_grid(folder: Path, cells: int, name: str = "overhead") -> Path:
    """A grid of exactly `cells` tiny cells (same_pair on 16 examples, d_model 8, one layer,
    one step; two mechanisms x ceil(cells / 2) seeds) in `folder`, its store beside it."""
    seeds = math.ceil(cells / 2)
    lines = [
        f'name = "{name}"',
        f"seeds = {list(range(seeds))}",
        f'store = "{name}.sqlite"',
        "",
        "[[tasks]]",
        'name = "same_pair"',
        "kwargs = { n_train = 16, n_validation = 8, n_test = 8 }",
        "",
        "[[sizes]]",
        'label = "xxs"',
        "d_model = 8",
        "n_layers = 1",
    ]
    for heads in (1, 2):
        lines += ["", "[[mechanisms]]", f'label = "std{heads}"', 'name = "standard"']
        lines.append(f"kwargs = {{ n_heads = {heads} }}")
    lines += ["", "[training]", *(f"{k} = {v}" for k, v in CELL_TRAINING.items())]
    if cells % 2:  # an odd count: drop the last seed's second mechanism
        lines += ["", "[grid]", f'exclude = [{{ mechanism = "std2", seed = {seeds - 1} }}]']
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class CpuSampler:
    """This process's CPU time (all threads), sampled every `period` seconds in a thread;
    `cpu_at(t)` interpolates it at wall time `t` (time.time())."""

    def __init__(self, period: float = 0.02):
        self.period = period
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.times.append(time.time())
            self.cpu.append(time.process_time())
            if self.stop.wait(self.period):
                break

    def __enter__(self) -> CpuSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def cpu_at(self, t: float) -> float:
        i = min(max(bisect.bisect_left(self.times, t), 1), len(self.times) - 1)
        (t0, t1), (c0, c1) = self.times[i - 1 : i + 1], self.cpu[i - 1 : i + 1]
        return c0 + (c1 - c0) * min(max((t - t0) / max(t1 - t0, 1e-9), 0.0), 1.0)


def measure_run(
    grid: Path, executor: str, workers: int, address: str | None = None
) -> dict[str, float]:
    """Run `grid` (every cell unfinished) with `executor` in this process; its timings."""
    from ablations.grid.spec import load_grid
    from ablations.results.store import ResultsStore
    from ablations.run.runner import run_grid

    spec = load_grid(grid)
    with CpuSampler() as cpu, open(os.devnull, "w") as out:
        begin = time.time()
        counts = run_grid(spec, executor=executor, workers=workers, address=address, out=out)
        end = time.time()
    rows = list(ResultsStore(spec.store, readonly=True).rows())
    if counts["done"] != len(spec.cells) or len(rows) != counts["done"]:
        raise RuntimeError(f"{executor}: {counts} of {len(spec.cells)} cells; store: {len(rows)}")
    started = min(row["started"] for row in rows)
    finished = sorted(row["finished"] for row in rows)
    steady = [row for row in rows if row["finished"] > finished[0]]
    window = finished[-1] - finished[0]
    train = statistics.mean(row["metrics"]["wall_s"] for row in steady)
    per_cell = window / len(steady)
    return {
        "cells": len(rows),
        "slots": workers,
        "total_s": end - begin,
        "startup_s": started - begin,
        "first_cell_s": finished[0] - started,
        "cells_per_s": len(steady) / window,
        "train_ms": 1e3 * train,
        "overhead_ms": 1e3 * (per_cell - train / workers),
        "driver_cpu_ms": 1e3 * (cpu.cpu_at(finished[-1]) - cpu.cpu_at(finished[0])) / len(steady),
    }


def measure_run_cell(grid: Path, n: int = 20) -> float:
    """Median seconds of `run_cell` (one torch thread, in this process) on the first `n`
    cells of `grid`, after one warm-up cell."""
    import torch

    from ablations.grid.spec import load_grid
    from ablations.run.cell_worker import run_cell

    threads = torch.get_num_threads()
    cells = load_grid(grid).cells[: n + 1]
    times = []
    try:
        for cell in cells:
            begin = time.perf_counter()
            outcome = run_cell(cell, 1)
            times.append(time.perf_counter() - begin)
            if outcome.status != "done":
                raise RuntimeError(f"run_cell: {outcome.error}")
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times[1:] or times)


def measure_store(grid: Path, folder: Path) -> dict[str, float]:
    """Seconds per cell of `claim`, then `finish` (a realistic outcome) of every cell of
    `grid` in a fresh store in `folder`, and of reading every row back."""
    from ablations.grid.spec import load_grid
    from ablations.results.store import ResultsStore

    configs = [cell.config() for cell in load_grid(grid).cells]
    store = ResultsStore(folder / "store_only.sqlite")
    metrics = {"steps": 1, "params": 1234, "wall_s": 0.01, "step_ms": 10.0, "val_loss": 0.69,
               "val_acc": 0.5, "test_loss": 0.69, "test_acc": 0.5}  # fmt: skip
    environment = {"python": platform.python_version(), "torch": "2", "attn_zoo": "0.1.0",
                   "machine": platform.machine(), "threads": 1, "device": "cpu",
                   "dtype": "float32", "commit": "0" * 40}  # fmt: skip
    begin = time.perf_counter()
    keys = [store.claim(config) for config in configs]
    claimed = time.perf_counter()
    for key in keys:
        store.finish(key, "done", metrics, [[1, 0.69, 0.69, 0.5]], environment)
    finished = time.perf_counter()
    rows = list(store.rows())
    read = time.perf_counter()
    if len(rows) != len(configs) or any(row["status"] != "done" for row in rows):
        raise RuntimeError(f"the store holds {len(rows)} rows, not {len(configs)} done cells")
    n = len(configs)
    return {
        "cells": n,
        "claim_ms": 1e3 * (claimed - begin) / n,
        "finish_ms": 1e3 * (finished - claimed) / n,
        "read_ms": 1e3 * (read - finished) / n,
    }


def text(value: object) -> str:
    """A table cell's text: floats to two decimals."""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def markdown(rows: list[dict], columns: dict[str, str]) -> str:
    """`rows` as a markdown table: `columns` maps a row key to its header."""
    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---:|" * len(columns)]
    lines += ["| " + " | ".join(text(row[k]) for k in columns) + " |" for row in rows]
    return "\n".join(lines)


RUN_COLUMNS = {
    "executor": "executor",
    "cells": "cells",
    "slots": "slots",
    "total_s": "total s",
    "startup_s": "startup s",
    "first_cell_s": "first cell s",
    "cells_per_s": "steady cells/s",
    "train_ms": "cell wall_s ms",
    "overhead_ms": "overhead ms/cell",
    "driver_cpu_ms": "driver CPU ms/cell",
}
INTRO = (
    "Grids of tiny cells (same_pair on 16 examples, d_model 8, one layer, one training step) run "
    "through run_grid in one process. Steady part: from the first cell finished to the last. "
    "Overhead per cell: the steady wall time per cell minus the cells' own training time "
    "(metrics.wall_s) over the slots: scheduling, store writes, the worker's task and model "
    "building and test evaluation, process and IPC overhead. Driver CPU: this process's CPU "
    "time (all its threads) over the steady part, per cell. The store alone: claim, then "
    "finish, of every cell in a fresh store (one SQLite transaction each), then reading every "
    "row back."
)
RUN_CELL_TEXT = (
    "run_cell in this process, 1 torch thread: {median_ms:.1f} ms per cell (median of {cells}): a "
    "worker's whole work for a cell"
)
STORE_COLUMNS = {
    "cells": "cells",
    "claim_ms": "claim ms/cell",
    "finish_ms": "finish ms/cell",
    "read_ms": "rows() ms/cell",
}


def parser() -> argparse.ArgumentParser:
    from ablations.arguments import COUNT, Help, number

    p = argparse.ArgumentParser(
        prog="python -m ablations.bench.engine_overhead",
        description="Time the grid driver's overhead per cell on grids of tiny cells (local "
        "executor, Ray, and the results store alone); prints markdown tables.",
        formatter_class=Help,
    )
    p.add_argument("--cells", type=COUNT, nargs="+", default=[100, 500],
                   help="grid sizes (cells) to run, each with every executor")  # fmt: skip
    p.add_argument("--address", default=None,
                   help="Ray cluster address, e.g. of `ray start --head` (without it: Ray "
                   "runs only when --executors names it, on a local instance)")  # fmt: skip
    p.add_argument("--executors", nargs="+", choices=("local", "ray"), default=None,
                   help="executors to time (without it: local, and ray with "
                   "--address)")  # fmt: skip
    p.add_argument("--workers", type=COUNT, default=2,
                   help="cells at once (local worker processes, Ray tasks in flight)")  # fmt: skip
    p.add_argument("--store-cells", type=COUNT, nargs="+", default=None,
                   help="sizes of the store-alone timing (without it: the --cells "
                   "sizes)")  # fmt: skip
    p.add_argument("--run-cell", type=number(int, 0), default=20,
                   help="cells timed with run_cell in this process (0: none)")  # fmt: skip
    p.add_argument("--folder", default=None,
                   help="where the grids and stores go (without it: a temporary folder, "
                   "removed afterwards)")  # fmt: skip
    p.add_argument("--report", default=None,
                   help="folder to write the tables to as CSVs, report.md and index.html "
                   "(created if missing; checked before anything is measured)")  # fmt: skip
    return p


def write_report(
    folder: Path,
    command: str,
    runs: list[dict],
    run_cell: dict | None,
    stores: list[dict],
    workers: int,
) -> None:
    """The measured tables in `folder`: runs.csv, run_cell.csv (when measured), store.csv, and
    report.md and index.html (the machine, the date, `command` and each table)."""
    import pandas as pd

    from ablations.bench.measure import machine
    from ablations.report.pages import (
        Page,
        Paragraph,
        Section,
        Table,
        generated_now,
        write_csv,
        write_pages,
    )

    def shown(rows: list[dict], columns: dict[str, str]) -> Table:
        return Table(pd.DataFrame([{h: text(r[k]) for k, h in columns.items()} for r in rows]))

    facts = [
        f"Machine: {machine()}",
        f"Generated: {generated_now()}",
        f"Command: {command}",
    ]
    page = Page("Grid driver overhead", facts, INTRO)
    runs_section = Section(f"Grid runs (run_grid in this process, {workers} slots)")
    runs_section.parts.append(shown(runs, RUN_COLUMNS))
    page.sections.append(runs_section)
    write_csv(pd.DataFrame(runs)[list(RUN_COLUMNS)], folder / "runs.csv")
    if run_cell is not None:
        section = Section("A cell without an executor")
        section.parts += [Paragraph(RUN_CELL_TEXT.format(**run_cell))]
        page.sections.append(section)
        write_csv(pd.DataFrame([run_cell]), folder / "run_cell.csv")
    else:  # an earlier run's, not this one's
        (folder / "run_cell.csv").unlink(missing_ok=True)
    store_section = Section("The results store alone (one SQLite transaction per claim and finish)")
    store_section.parts.append(shown(stores, STORE_COLUMNS))
    page.sections.append(store_section)
    write_csv(pd.DataFrame(stores)[list(STORE_COLUMNS)], folder / "store.csv")
    write_pages(page, folder)


def main(argv: list[str] | None = None) -> int:
    """Run the measurements of `argv` (see `parser`), print their tables and write them to
    --report's folder."""
    args = parser().parse_args(argv)
    executors = args.executors or (["local", "ray"] if args.address else ["local"])
    report = None
    if args.report is not None:
        from ablations.report.pages import writable_folder

        try:
            report = writable_folder("--report", args.report)
        except ValueError as err:
            parser().error(str(err))
        if any(report.iterdir()) and not (report / "runs.csv").is_file():
            parser().error(f"--report {args.report}: not empty and not an earlier report "
                           "of this measurement (no runs.csv): use a new folder")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="engine_overhead_") as scratch:
        folder = Path(args.folder or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}, "
              f"python {platform.python_version()}")  # fmt: skip
        runs = []
        for cells in args.cells:
            for executor in executors:
                grid = write_grid(folder, cells, f"overhead_{executor}_{cells}")
                for stale in folder.glob(f"{grid.stem}.sqlite*"):  # a --folder used before
                    stale.unlink()
                address = args.address if executor == "ray" else None
                runs.append({"executor": executor, **measure_run(grid, executor, args.workers,
                                                                 address)})  # fmt: skip
                print(f"ran {executor} x {cells} cells", flush=True)
        print(f"\n## Grid runs (run_grid in this process, {args.workers} slots)\n")
        print(markdown(runs, RUN_COLUMNS))
        run_cell = None
        if args.run_cell:
            grid = write_grid(folder, args.run_cell + 1, "overhead_run_cell")
            run_cell = {
                "cells": args.run_cell,
                "median_ms": 1e3 * measure_run_cell(grid, args.run_cell),
            }
            print("\n" + RUN_CELL_TEXT.format(**run_cell))
        stores = []
        for cells in args.store_cells or args.cells:
            sub = folder / f"store_{cells}"
            sub.mkdir(exist_ok=True)
            for stale in sub.glob("store_only.sqlite*"):
                stale.unlink()
            stores.append(measure_store(write_grid(sub, cells), sub))
        print("\n## The results store alone (one SQLite transaction per claim and finish)\n")
        print(markdown(stores, STORE_COLUMNS))
    if report is not None:
        words = sys.argv[1:] if argv is None else argv
        command = shlex.join(["python", "-m", "ablations.bench.engine_overhead", *words])
        write_report(report, command, runs, run_cell, stores, args.workers)
        print(f"\nwrote {report}/report.md, index.html and the CSVs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
