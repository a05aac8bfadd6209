"""A committed report's cells rerun at the code checked out now, and compared with what the
report says (``attn-zoo reproduce REPORT_DIR``):

    frame = reproduce(Path("reports/demo"), sample=4, seed=0)   # -> reports/demo/reproduce.csv

Each cell is rebuilt from its row of the report's cells.csv (its config, read back by
ablations/results/cells_file.py) and must hash to the key the row records, so the rerun is the
cell the report ran, not a lookalike; a relative data file is looked up beside the grid file
the report's provenance.json names. The cell trains here with the torch threads its row records
(1 where none is) and its own precision and seed (its config), on the device its row records
when this machine has it; a cell recorded on a GPU that this machine lacks is listed as not
rerun, with the reason. `sample` done cells are drawn with `seed` (`keys` picks them instead).

Before any training, a cell whose mechanism or task is registered under no name here is
refused, naming the plugins the cell recorded (environment.plugins) to pass with --import.

One row per (cell, metric) either run has: committed, rerun, difference (rerun - committed),
and where each ran (commit, device, threads: `threads` is the rerun's); a metric one run lacks
has its note ("missing in the rerun"), and so has every row of a cell whose rerun imported other
plugin code than the cell recorded ("other plugin code: ..."). Timings (`TIMINGS`)
are machine facts, not results: left out. Each cell's rows are merged into reproduce.csv as it
finishes, under an OS lock (`reruns_lock`) that two runs at once and a report rewritten into the
folder take in turn, so none loses another's rows; SIGINT (Ctrl-C) or SIGTERM loses only the cell
in progress, and says how many were kept. The differences are left to the reader to weigh: a
difference within the run-to-run variance across thread counts (reports/thread_variance) is
noise; one above it has a cause to find.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch

from ablations.grid.cell import Cell
from ablations.grid.plugins import import_plugins, resolve
from ablations.results.cells_file import CellsFile
from ablations.run.cell_worker import run_cell
from ablations.run.provenance import plugin_record, short_record, source_state
from ablations.run.runner import GridInterrupted
from ablations.tasks.registry import TASKS
from attn_zoo.mechanisms.registry import MECHANISMS
from attn_zoo.registry import unknown_name_error

FILE = "reproduce.csv"
TIMINGS = frozenset({"step_ms", "wall_s"})  # how fast, not what: differs by machine and load
COLUMNS = ("key", "task", "size", "mechanism", "seed", "metric", "committed", "rerun",
           "difference", "committed_commit", "rerun_commit", "committed_device", "rerun_device",
           "committed_threads", "threads", "note")  # fmt: skip


def rebuilt_cell(row: dict, folder: str) -> Cell:
    """The cell of a cells.csv row (`CellsFile.rows()`), its relative data files looked up in
    `folder`; ValueError where the config read back hashes to another key than the row's (a
    column lost or rounded: the rerun would be another cell)."""
    try:
        cell = Cell(**row["config"], folder=folder)
    except TypeError as err:
        raise ValueError(f"cell {row['key']}: its row is no cell's config ({err})") from None
    if cell.key != row["key"]:
        raise ValueError(
            f"cell {row['key']}: the config its row holds hashes to {cell.key}, so a rerun "
            "would not be the same cell (a setting of it is missing from cells.csv or was "
            "rounded there)"
        )
    return cell


def chosen_rows(rows: list[dict], sample: int, seed: int, keys: Sequence[str]) -> list[dict]:
    """The done rows to rerun: those of `keys` (every one must be a done cell), else `sample`
    drawn at random with `seed` (all of them where there are fewer)."""
    done = {row["key"]: row for row in rows if row["status"] == "done"}
    if keys:
        missing = [key for key in keys if key not in done]
        if missing:
            raise ValueError(
                f"--key {', '.join(missing)}: no done cell of the report has that key "
                f"({len(done)} done cells; their keys are cells.csv's first column)"
            )
        return [done[key] for key in keys]
    if sample < 1:
        raise ValueError(f"--sample {sample}: the number of cells to rerun must be 1 or more")
    chosen = random.Random(seed).sample(sorted(done), min(sample, len(done)))
    return [done[key] for key in chosen]


def grid_folder(report: Path) -> str:
    """The folder of the grid file the report's provenance.json names ("" without one): where a
    cell's relative data file is looked up first, as when the grid ran."""
    provenance = report / "provenance.json"
    if not provenance.is_file():
        return ""
    grid = json.loads(provenance.read_text(encoding="utf-8")).get("grid_file")
    return str(Path(grid).parent) if grid else ""


def reproduce(
    report: Path,
    sample: int = 4,
    seed: int = 0,
    keys: Sequence[str] = (),
    imports: Sequence[str] = (),
    threads: int | None = None,
    on_cell: Callable[[int, int, str], None] | None = None,
) -> pd.DataFrame:
    """Rerun cells of the report in folder `report` (see the module) and write the comparison to
    `report`/reproduce.csv, each cell's rows as it finishes (an earlier one's rows kept for the
    cells not rerun now);
    `threads`: the torch threads of every rerun in place of each cell's recorded count (a probe
    of run-to-run variance: rows of other thread counts are kept beside them);
    `on_cell(i, n, cell)` before each cell. The frame (this run's rows) has `COLUMNS`.
    ValueError (before any training) for a report without a cells.csv, a row that is no cell,
    a cell whose mechanism or task is unknown here (`check_names`), keys that are no done cell,
    or a reproduce.csv that is not one. Stopped by SIGINT or SIGTERM: prints how many cells'
    rows were kept and raises ablations.run.runner.GridInterrupted (the CLI exits 130 or 143)."""
    cells = CellsFile(report / "cells.csv")
    _earlier(report / FILE)  # refused now, not after the training; read again to merge
    folder = grid_folder(report)
    chosen = [
        (row, rebuilt_cell(row, folder), thread_count(row, threads))
        for row in chosen_rows(cells.rows(), sample, seed, keys)
    ]
    import_plugins(imports, where="--import")
    for row, cell, _ in chosen:
        check_names(row, cell)
    plugins = plugin_record(resolve(imports))
    commit = source_state()["commit"]
    lines, kept, stops = [], 0, _Stops()
    try:
        with stops.installed():
            for i, (row, cell, count) in enumerate(chosen):  # every row checked first
                if on_cell is not None:
                    on_cell(i, len(chosen), str(cell))
                rows = rerun_rows(row, cell, count, imports, commit, plugins)
                with stops.held(), reruns_lock(report):  # kept as it finishes, counted
                    mine = pd.DataFrame(rows, columns=list(COLUMNS))
                    _write(_merged(_earlier(report / FILE), mine), report / FILE)
                    lines, kept = lines + rows, kept + 1
    except KeyboardInterrupt as stop:  # SIGINT, or SIGTERM through `_Stops`
        signum = getattr(stop, "signum", signal.SIGINT)
        summary = (
            f"interrupted ({signal.Signals(signum).name}): the rows of {kept} of "
            f"{len(chosen)} cells are kept in {report / FILE}; the cell in progress and those "
            "after it were not rerun"
        )
        print(summary, file=sys.stderr, flush=True)
        raise GridInterrupted(signum, summary, {"done": kept}) from None
    return pd.DataFrame(lines, columns=list(COLUMNS))


def rerun_rows(
    row: dict, cell: Cell, count: int, imports: Sequence[str], commit: str, plugins: dict
) -> list[dict]:
    """The rows (`COLUMNS`) of one cell of `reproduce`: `cell` (of the cells.csv `row`) rerun
    here with `count` torch threads, the plugin modules `imports` at the source `commit`
    (`plugins`: their `plugin_record`), one row per metric either run has; one row with its
    note for a cell not rerun (a GPU cell on a machine without one) or not finished."""
    recorded = row["environment"] or {}
    device = str(recorded.get("device") or "cpu")
    place = dict(key=row["key"], task=cell.task, size=cell.size["label"],
                 mechanism=cell.mechanism, seed=cell.seed,
                 committed_commit=recorded.get("commit", "not recorded"), rerun_commit=commit,
                 committed_device=device, committed_threads=recorded.get("threads", ""),
                 threads=count)  # fmt: skip
    if device.startswith("cuda") and not torch.cuda.is_available():
        return [{**place, "rerun_device": "", "note": "not rerun: ran on a GPU"}]
    outcome = run_cell(cell, count, imports=imports, device=device)
    where = (outcome.environment or {}).get("device", "")
    code = other_plugins(recorded, plugins)
    if outcome.status != "done":
        error = (outcome.error or "").strip().splitlines()[-1:] or [""]
        note = _notes(f"rerun {outcome.status}: {error[0]}", code)
        return [{**place, "rerun_device": where, "note": note}]
    lines = []
    for metric, committed, rerun in compared_metrics(row["metrics"], outcome.metrics):
        gap = rerun - committed if _number(rerun) and _number(committed) else float("nan")
        missing = "missing in the rerun" if rerun is None else ""
        if committed is None:
            missing = "missing in the committed cells.csv"
        lines.append({**place, "metric": metric, "committed": committed, "rerun": rerun,
                      "difference": gap, "rerun_device": where,
                      "note": _notes(missing, code)})  # fmt: skip
    return lines


def check_names(row: dict, cell: Cell) -> None:
    """ValueError naming the cell, when its mechanism or task is registered under no name here
    (a plugin's: ablations.grid.plugins), with the plugins the cell was trained with
    (environment.plugins in cells.csv) and how to import them."""
    recorded = (row["environment"] or {}).get("plugins")
    if isinstance(recorded, dict) and recorded:
        hint = (
            f"The cell was trained with the plugins {', '.join(recorded)}: pass each with "
            "--import (a .py file's path or a module's name; an entry point's package installed)."
        )
    else:
        hint = "The cell records no plugins that registered it."
    names = (("mechanism", MECHANISMS, cell.mechanism_name), ("task", TASKS, cell.task_name))
    for kind, registry, name in names:
        if name not in registry:
            error = unknown_name_error(kind, name, registry)
            raise ValueError(f"cell {row['key']} ({cell}): {error} {hint}")


def other_plugins(recorded: dict, plugins: dict) -> str:
    """The note on a cell's rows when the plugin code of the rerun (`plugins`, this run's
    `plugin_record`) is not the code the cell recorded (its environment's "plugins", compared as
    ablations.run.provenance.mixed_provenance does: the digests as a set, paths not counted):
    "" when it is, or when the cell recorded none (a store written before they were)."""
    committed = recorded.get("plugins")
    if not isinstance(committed, dict) or sorted(map(str, committed.values())) == sorted(
        map(str, plugins.values())
    ):
        return ""
    return (
        f"other plugin code: the cell was trained with {short_record(committed)}, the rerun "
        f"imports {short_record(plugins)}"
    )


def compared_metrics(committed: dict, rerun: dict) -> list[tuple[str, object, object]]:
    """(metric, committed value, rerun value) for each metric either run has, sorted, timings
    (`TIMINGS`) left out; None for the value of the run that lacks it."""
    names = sorted((set(committed) | set(rerun)) - TIMINGS)
    return [(name, committed.get(name), rerun.get(name)) for name in names]


def _notes(*notes: str) -> str:
    """The non-empty `notes` as one, "; " between them."""
    return "; ".join(note for note in notes if note)


@contextmanager
def reruns_lock(report: Path) -> Iterator[None]:
    """An OS lock (flock) on the folder that holds the report folder `report`, held until the
    block ends or its process dies: reproduce merges each cell's rows into reproduce.csv under
    it, and a report written into `report` reads that file and replaces the folder under it
    (ablations/report/build.py), so that neither loses the other's rows. On the parent, not on
    `report` itself: a report swaps that folder for a new one (ablations/report/folder.py),
    which a lock on the old one would not hold. No file is left anywhere."""
    handle = os.open(report.resolve().parent, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # closing it releases the lock


STOPS = (signal.SIGINT, signal.SIGTERM)  # what stops `reproduce` between two cells' rows


class _Stopped(KeyboardInterrupt):
    """A stop signal (`STOPS`) during the reruns; `signum` says which."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Stops:
    """SIGINT and SIGTERM while `reproduce` reruns cells (`installed`): either raises `_Stopped`
    in the main thread, stopping the cell that trains there; in `held()` (a finished cell's
    rows being written and counted) the stop waits until the block ends. Off the main thread,
    which cannot set handlers, the signals are left as they are."""

    def __init__(self) -> None:
        self.holding, self.pending = False, None

    def handle(self, signum: int, frame: object) -> None:
        if not self.holding:
            raise _Stopped(signum)
        self.pending = self.pending or signum

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handler set for the block, the handlers there were put back after it."""
        main = threading.current_thread() is threading.main_thread()
        previous = {signum: signal.getsignal(signum) for signum in STOPS} if main else {}
        for signum in previous:
            signal.signal(signum, self.handle)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A stop in the block raises `_Stopped` after it."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            raise _Stopped(self.pending)


def _earlier(path: Path) -> pd.DataFrame | None:
    """The rows of an earlier reproduce.csv at `path` (None without one); ValueError for a file
    of that name that is not one."""
    if not path.is_file():
        return None
    earlier = pd.read_csv(path, dtype={"key": str}, keep_default_na=False)
    if list(earlier.columns) != list(COLUMNS):
        raise ValueError(f"{path} is not a reproduce.csv (columns {', '.join(earlier.columns)})")
    if not earlier.threads.astype(str).str.fullmatch(r"[1-9]\d*").all():
        raise ValueError(
            f"{path} is not a reproduce.csv: its threads column holds other than counts"
        )
    return earlier


def thread_count(row: dict, threads: int | None) -> int:
    """The torch threads a rerun of `row` takes: `threads`, else the count its environment
    records (1 where none is); ValueError naming the cell for a recorded one that is no count."""
    if threads is not None:
        return threads
    recorded = (row["environment"] or {}).get("threads")
    if recorded is None:
        return 1
    if isinstance(recorded, float) and recorded.is_integer():
        recorded = int(recorded)
    if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 1:
        raise ValueError(
            f"cell {row['key']}: environment.threads = {recorded!r} in cells.csv is no thread "
            "count (a whole number >= 1); pass --threads N to rerun it"
        )
    return recorded


def _merged(earlier: pd.DataFrame | None, frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` after the `earlier` rows of the (cell, threads) it does not rerun: reruns of
    other samples or thread counts add up, a cell rerun again with as many threads keeps its
    newest rows only."""

    def pairs(rows: pd.DataFrame) -> list[tuple[str, int]]:
        return list(zip(rows.key, rows.threads.astype(int), strict=True))

    rerun = set(pairs(frame))
    kept = None if earlier is None else earlier[[pair not in rerun for pair in pairs(earlier)]]
    return frame if kept is None or kept.empty else pd.concat([kept, frame], ignore_index=True)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _write(frame: pd.DataFrame, path: Path) -> None:
    """`frame` as CSV at `path`, whole or not at all (a temporary file renamed over it)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            frame.to_csv(out, index=False, float_format="%.10g")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def summary(frame: pd.DataFrame) -> list[str]:
    """Lines saying, per metric, how many cells reran identically (a metric one run lacks is no
    identical one) and the largest difference; then the cells not rerun or not finished, the
    metrics one run lacks and the cells rerun with other plugin code, with their notes."""
    lines = []
    compared = frame.dropna(subset=["metric"])
    for metric, group in compared.groupby("metric", sort=True):
        text = f"{metric}: {int((group.difference == 0).sum())} of {len(group)} cells identical"
        if (group.difference.fillna(0) != 0).any():
            largest = group.loc[group.difference.abs().idxmax()]
            text += f"; largest difference {largest.difference:+.4g} ({largest.mechanism}, "
            text += f"seed {largest.seed})"
        lines.append(text)
    noted = frame[frame.note.fillna("") != ""]
    for (key, mechanism, seed, note), rows in noted.groupby(
        ["key", "mechanism", "seed", "note"], sort=False
    ):
        metrics = ", ".join(rows.metric.dropna())
        lines.append(f"{key} ({mechanism}, seed {seed}){' ' + metrics if metrics else ''}: {note}")
    return lines
