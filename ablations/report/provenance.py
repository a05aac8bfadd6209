"""What a report was built from (provenance.json and the page's header): the source, the
grid file and its SHA-256, its overrides, the grids' axes, the environments the cells ran in,
the date; and the done cells stored with non-finite metrics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ablations.report.pages import generated_now
from ablations.results.axes import CellSource, GridAxes
from ablations.results.cells_file import lacks_environment
from ablations.run.provenance import file_sha256


def _environments(store: CellSource) -> list[str]:
    """The distinct (torch, machine, GPU, threads, commit) the cells ran with, as texts (the
    GPU's name where a cell trained on one); for the rows of a cells.csv without them, the
    line of the report.md beside it (`recorded_environment`), said to be theirs when other
    rows have their own."""
    seen, missing = [], 0
    for row in store.rows():
        env = dict(row["environment"] or {})
        if str(env.get("device", "cpu")).startswith("cuda") and env.get("device_name"):
            env["gpu"] = env["device_name"]
        keys = ("torch", "machine", "gpu", "threads", "commit")
        text = ", ".join(f"{k} {env[k]}" for k in keys if k in env)
        missing += lacks_environment(row)
        if text and text not in seen:
            seen.append(text)
    recorded = getattr(store, "recorded_environment", None)
    if missing and recorded:
        whose = f"for the {missing} cells without one in cells.csv: " if seen else ""
        seen.append(f"{whose}{recorded} (as the report.md beside {store.path} recorded it)")
    return seen


def non_finite_metrics(store: CellSource) -> dict[str, str]:
    """Per key of a done cell with NaN or infinite metrics (a store written before training
    recorded such a cell as diverged), those metrics' names: 'val_loss, test_loss'."""
    found = {}
    for row in store.rows():
        metrics = row["metrics"] or {}
        names = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
        if row["status"] == "done" and names:
            found[row["key"]] = ", ".join(names)
    return found


def provenance_record(
    store: CellSource,
    curves: pd.DataFrame | None,
    grid: str | Path | None,
    overrides: Sequence[str],
    axes: dict[str, GridAxes],
) -> dict:
    """What the report was built from, as provenance.json holds it: `source` (the store's or
    cells.csv's path), `curves` (whether it had learning curves), `attention_carried` (whether a
    cells.csv's report beside it gave it at least one attention map), `grid_file` and `grid_sha256`
    (the grid file's SHA-256; None without a grid), `overrides` (its --set values), `axes` (the
    report's grids' swept keys and selection, as their runs recorded them: results/axes.py, read
    back by a report rebuilt from its cells.csv), `environment` (`_environments`) and `generated`
    (the date)."""
    digest = None if grid is None else file_sha256(grid)
    return {
        "source": str(store.path),
        "curves": curves is not None,
        "attention_carried": not store.draws_maps and bool(store.attention and store.attention[1]),
        "grid_file": None if grid is None else str(grid),
        "grid_sha256": digest,
        "overrides": list(overrides),
        "axes": {name: grid_axes.to_json() for name, grid_axes in axes.items()},
        "environment": _environments(store),
        "generated": generated_now(),
    }
