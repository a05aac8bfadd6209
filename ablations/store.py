"""The results store: one SQLite file per grid, one row per cell.

A cell is keyed by the hash of its fully resolved config (canonical JSON, SHA-256), so running
a grid again finds the cells that are done. Every write is one transaction (SQLite WAL), so a
run killed at any point (SIGKILL included) leaves each row either as it was before the write
or as it is after: a cell that was running when the run died is still `running` and is simply
run again; no finished row is lost or duplicated.

Statuses: running, done, failed (with its traceback), diverged (NaN/inf loss, at its step).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd

STATUSES = ("running", "done", "failed", "diverged")
FINISHED = ("done", "failed", "diverged")

SCHEMA = """
CREATE TABLE IF NOT EXISTS cells (
    key TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    metrics TEXT,
    curve TEXT,
    environment TEXT,
    error TEXT,
    started REAL,
    finished REAL
)
"""


def error_summary(error: str | None) -> str:
    """The last non-blank line of a failed cell's traceback (the exception and its message)."""
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no traceback recorded"


def config_key(config: Mapping) -> str:
    """SHA-256 of the config's canonical JSON (sorted keys): equal configs, equal keys."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class ResultsStore:
    """Rows of one grid in the SQLite file at `path` (created with its folder if missing)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def start(self, config: Mapping) -> str:
        """Mark the cell of `config` running (a re-run replaces an unfinished row); its key."""
        key = config_key(config)
        with self._connect() as db:
            db.execute(
                "INSERT INTO cells (key, config, status, started) VALUES (?, ?, 'running', ?) "
                "ON CONFLICT(key) DO UPDATE SET status='running', started=excluded.started, "
                "metrics=NULL, curve=NULL, error=NULL, finished=NULL",
                (key, json.dumps(config, sort_keys=True, default=str), time.time()),
            )
        return key

    def finish(
        self,
        key: str,
        status: str,
        metrics: Mapping | None = None,
        curve: list | None = None,
        environment: Mapping | None = None,
        error: str | None = None,
    ) -> None:
        """Record the outcome of cell `key` in one transaction."""
        if status not in FINISHED:
            raise ValueError(f"status={status!r}: a finished cell is one of {FINISHED}")
        with self._connect() as db:
            updated = db.execute(
                "UPDATE cells SET status=?, metrics=?, curve=?, environment=?, error=?, finished=? "
                "WHERE key=?",
                (status, json.dumps(metrics), json.dumps(curve), json.dumps(environment), error,
                 time.time(), key),
            ).rowcount  # fmt: skip
        if not updated:
            raise KeyError(f"no cell {key} in {self.path}: call start() first")

    def checkpoint_path(self, key: str) -> Path:
        """Where cell `key`'s trained weights are kept (grids with checkpoints = true)."""
        return self.path.parent / f"{self.path.stem}.checkpoints" / f"{key}.pt"

    def save_checkpoint(self, key: str, state: bytes) -> Path:
        """Write `state` (torch.save bytes) for cell `key` atomically; its path."""
        path = self.checkpoint_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_bytes(state)
        partial.replace(path)
        return path

    def status(self, config: Mapping) -> str | None:
        """The status of `config`'s cell, or None if it never started."""
        with self._connect() as db:
            row = db.execute(
                "SELECT status FROM cells WHERE key=?", (config_key(config),)
            ).fetchone()
        return None if row is None else row[0]

    def finished_keys(self, statuses: tuple[str, ...] = FINISHED) -> set[str]:
        """Keys of the cells whose status is one of `statuses` (default: any finished one)."""
        marks = ", ".join("?" * len(statuses))
        with self._connect() as db:
            rows = db.execute(f"SELECT key FROM cells WHERE status IN ({marks})", statuses)
            return {key for (key,) in rows.fetchall()}

    def rows(self) -> Iterator[dict]:
        with self._connect() as db:
            db.row_factory = sqlite3.Row
            for row in db.execute("SELECT * FROM cells ORDER BY started"):
                row = dict(row)
                for field in ("config", "metrics", "curve", "environment"):
                    row[field] = None if row[field] is None else json.loads(row[field])
                yield row

    def to_dataframe(self) -> pd.DataFrame:
        """One row per cell: key, status, error, times, then config.* and metrics.* columns."""
        records = []
        for row in self.rows():
            record = {k: row[k] for k in ("key", "status", "error", "started", "finished")}
            record.update({f"config.{k}": v for k, v in (row["config"] or {}).items()})
            record.update({f"metrics.{k}": v for k, v in (row["metrics"] or {}).items()})
            record["curve"] = row["curve"]
            records.append(record)
        return pd.DataFrame(records)
