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

One row per (cell, metric) both runs have: committed, rerun, difference (rerun - committed),
and where each ran (commit, device, threads: `threads` is the rerun's). Timings (`TIMINGS`)
are machine facts, not results: left out. The differences are left to the reader to weigh: a
difference within the run-to-run variance across thread counts (reports/thread_variance) is
noise; one above it has a cause to find.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch

from ablations.grid.cell import Cell
from ablations.results.cells_file import CellsFile
from ablations.run.cell_worker import run_cell
from ablations.run.provenance import source_state

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
    `report`/reproduce.csv (an earlier one's rows kept for the cells not rerun now);
    `threads`: the torch threads of every rerun in place of each cell's recorded count (a probe
    of run-to-run variance: rows of other thread counts are kept beside them);
    `on_cell(i, n, cell)` before each cell. The frame (this run's rows) has `COLUMNS`.
    ValueError (before any training) for a report without a cells.csv, a row that is no cell,
    keys that are no done cell, or a reproduce.csv that is not one."""
    cells = CellsFile(report / "cells.csv")
    earlier = _earlier(report / FILE)
    folder = grid_folder(report)
    rows = chosen_rows(cells.rows(), sample, seed, keys)
    chosen = [(row, rebuilt_cell(row, folder), thread_count(row, threads)) for row in rows]
    commit = source_state()["commit"]
    lines = []
    for i, (row, cell, count) in enumerate(chosen):  # every row checked first
        if on_cell is not None:
            on_cell(i, len(chosen), str(cell))
        recorded = row["environment"] or {}
        device = str(recorded.get("device") or "cpu")
        place = dict(key=row["key"], task=cell.task, size=cell.size["label"],
                     mechanism=cell.mechanism, seed=cell.seed,
                     committed_commit=recorded.get("commit", "not recorded"), rerun_commit=commit,
                     committed_device=device, committed_threads=recorded.get("threads", ""),
                     threads=count)  # fmt: skip
        if device.startswith("cuda") and not torch.cuda.is_available():
            lines.append({**place, "rerun_device": "", "note": "not rerun: ran on a GPU"})
            continue
        outcome = run_cell(cell, count, imports=imports, device=device)
        where = (outcome.environment or {}).get("device", "")
        if outcome.status != "done":
            error = (outcome.error or "").strip().splitlines()[-1:] or [""]
            lines.append({**place, "rerun_device": where,
                          "note": f"rerun {outcome.status}: {error[0]}"})  # fmt: skip
            continue
        for metric, value in sorted(row["metrics"].items()):
            if metric in TIMINGS or metric not in outcome.metrics:
                continue
            rerun = outcome.metrics[metric]
            difference = rerun - value if _number(rerun) and _number(value) else float("nan")
            lines.append({**place, "metric": metric, "committed": value, "rerun": rerun,
                          "difference": difference, "rerun_device": where, "note": ""})  # fmt: skip
    frame = pd.DataFrame(lines, columns=list(COLUMNS))
    _write(_merged(earlier, frame), report / FILE)
    return frame


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
    """Lines saying, per metric, how many cells reran identically and the largest difference;
    then the cells not rerun or not finished, with why."""
    lines = []
    compared = frame.dropna(subset=["metric"])
    for metric, group in compared.groupby("metric", sort=True):
        text = f"{metric}: {int((group.difference == 0).sum())} of {len(group)} cells identical"
        if (group.difference.fillna(0) != 0).any():
            largest = group.loc[group.difference.abs().idxmax()]
            text += f"; largest difference {largest.difference:+.4g} ({largest.mechanism}, "
            text += f"seed {largest.seed})"
        lines.append(text)
    for _, row in frame[frame.note.fillna("") != ""].iterrows():
        lines.append(f"{row.key} ({row.mechanism}, seed {row.seed}): {row.note}")
    return lines
