"""Each cell's status in the store: one function for `ablate run`, `ablate status` and dry runs.

    frame = grid_status(spec)      # one row per cell of the grid, in grid order
    frame[frame.status == "todo"]  # never started (or given back by an interrupted run)

Statuses: todo, running (claimed by a live run), stale (claimed by a run that ended without giving
it back, e.g. killed, or stopped by a full disk that left no room to release it: the next run
trains it again), done, failed, diverged, pruned (a search's trial its pruner stopped: final, not
done). The store is opened read-only and never created; a store that does not exist yet means
every cell is todo.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from ablations.grid.spec import GridSpec
from ablations.labels import terminal_text
from ablations.results.frames import is_missing
from ablations.results.store import ResultsStore, claim_is_stale, error_summary

ERROR_CHARS = 400  # at most this many characters of an error's last line in the table
COLUMNS = ["key", "task", "size", "mechanism", "seed", "status", "steps", "test_acc", "error"]
# between mechanism and seed: the grid's swept keys (GridSpec.axes, as a run records them)


def grid_status(spec: GridSpec) -> pd.DataFrame:
    """One row per cell of `spec` (columns `COLUMNS`, with the swept keys before the seed):
    its key, labels, status and main metrics (steps trained, test accuracy) or the last line of
    its error."""
    rows = {}
    if spec.store.exists():
        rows = {row["key"]: row for row in ResultsStore(spec.store, readonly=True).rows()}
    records = []
    for cell in spec.cells:
        row = rows.get(cell.key, {})
        metrics = row.get("metrics") or {}
        error = row.get("error")
        status = row.get("status", "todo")
        if status == "running" and claim_is_stale(row.get("owner"), row.get("heartbeat")):
            status = "stale"
        records.append(
            {
                "key": cell.key,
                **cell.labels,
                "status": status,
                "steps": metrics.get("steps"),
                "test_acc": metrics.get("test_acc"),
                "error": error_summary(error) if error else None,
            }
        )
    columns = [*COLUMNS[:4], *spec.axes().swept, *COLUMNS[4:]]
    return pd.DataFrame(records, columns=columns).astype({"steps": "Int64", "test_acc": float})


def status_text(frame: pd.DataFrame, swept: list[str]) -> str:
    """`grid_status`'s rows (some columns may be dropped) as a text table: swept values as
    written (str: 1e-05 and 3e-05 stay apart), metrics to three decimals, steps whole, '-' for
    a value a cell does not have (not run or not finished); texts as `terminal_text` shows them
    (a label's escape sequence cannot reach the terminal; at most 60 characters)."""
    texts = frame.astype(object).copy()
    for column in frame.columns:
        if column in swept:
            form = terminal_text
        elif column == "steps":
            form = "{:.0f}".format
        elif pd.api.types.is_float_dtype(frame[column]):
            form = "{:.3f}".format
        elif column == "error":  # an error's last line, whole
            form = functools.partial(terminal_text, limit=ERROR_CHARS)
        else:
            form = terminal_text
        texts[column] = ["-" if is_missing(value) else form(value) for value in frame[column]]
    return texts.to_string(index=False)


PLUGIN_CODE = {  # what a cell's environment records of plugin code, and how a line names it
    "plugins": "plugins",
    "replaced": "built-in names replaced by a plugin",
    "outranking": "plugin backends outranking built-in ones (auto may pick them)",
}


def plugin_code(spec: GridSpec) -> list[str]:
    """One line per kind of plugin code (`PLUGIN_CODE`) the cells of `spec` in its store were
    run with, as their environments record it (ablations/run/train.py, ablations.run.
    provenance): "plugins: mine.py 1a2b3c4d5e6f", "built-in names replaced by a plugin:
    mechanism standard", "plugin backends outranking built-in ones (auto may pick them):
    softmax backend fast"; none where there is none (or no store)."""
    if not spec.store.exists():
        return []
    keys = {cell.key for cell in spec.cells}
    found: dict[str, dict] = {kind: {} for kind in PLUGIN_CODE}
    for row in ResultsStore(spec.store, readonly=True).rows():
        if row["key"] not in keys:
            continue
        env = row["environment"] or {}
        for name, digest in (env.get("plugins") or {}).items():
            found["plugins"][f"{Path(name).name} {(digest or 'no file')[:12]}"] = None
        for kind in ("replaced", "outranking"):
            found[kind].update(dict.fromkeys(env.get(kind) or []))
    return [f"{PLUGIN_CODE[kind]}: {', '.join(names)}" for kind, names in found.items() if names]
