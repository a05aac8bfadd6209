"""The results store: one SQLite file per grid, one row per cell.

A cell is keyed by the hash of its fully resolved config (canonical JSON, SHA-256), so running
a grid again finds the cells that are done. Every write is one transaction (SQLite WAL), so a
run killed at any point (SIGKILL included) leaves each row either as it was before the write
or as it is after.

Runs share a store through claims: `claim` marks a cell `running` with the run's owner id
("host:pid:uuid") and a heartbeat time, in one `BEGIN IMMEDIATE` transaction, and only if no
other live run holds it and it is not finished. Only the owner can `finish` or `release` its
claim; `heartbeat` keeps it fresh. A claim is stale (and can be taken over) when its heartbeat
is older than the lease, or when its owner was a process of this host that is no longer alive.
A done, diverged or pruned row is never overwritten; a failed one only by a claim with
`retry_failed`.

    store = ResultsStore("grid.sqlite")
    key = store.claim(config, owner)           # None: finished, or held by a live run
    if key is not None:
        store.finish(key, "done", metrics, curve, environment, owner=owner)

`ResultsStore(path, readonly=True)` reads a store without writing anything (for status and
reports): it never creates the file, its folder or the schema, and reads a store whose file or
folder is read-only. As tables (pandas):

    frame = store.to_dataframe()   # a row per cell: key, status, ..., training.lr, ...,
                                   # metrics.test_acc, ... (config keys as `flat_config` names them)
    curves = store.curves()        # a row per cell and evaluated step: key, step, train_loss,
                                   # val_loss, val_metric

Statuses: running, done, failed (with its traceback), diverged (NaN/inf loss, at its step),
pruned (a search's trial stopped at an evaluation by its pruner, ablations.run.search: final, with
its curve so far and `pruned_at`; not done).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import socket
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from ablations.results.axes import GridAxes, axes_from_json
from ablations.results.frames import cells_table

STATUSES = ("running", "done", "failed", "diverged", "pruned")
FINISHED = ("done", "failed", "diverged", "pruned")
LEASE = 60.0  # seconds without a heartbeat after which a claim is stale
TIMEOUT = 30.0  # seconds a write waits for another process's transaction
CURVE_FIELDS = ("step", "train_loss", "val_loss", "val_metric")  # a stored curve's points
CURVE_COLUMNS = ("key", *CURVE_FIELDS)  # `ResultsStore.curves()`

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
    finished REAL,
    owner TEXT,
    heartbeat REAL
)
"""
# A grid's axes (results/axes.py), recorded by each run of it: swept keys and [selection].
GRIDS_SCHEMA = "CREATE TABLE IF NOT EXISTS grids (name TEXT PRIMARY KEY, axes TEXT NOT NULL)"
# Columns added after the first schema: a store written before them gets them on opening.
ADDED_COLUMNS = {"owner": "TEXT", "heartbeat": "REAL"}
# Columns every store has: a cells table without them is not a results store.
STORE_COLUMNS = {"key", "config", "status", "metrics", "curve", "environment", "error", "started",
                 "finished"}  # fmt: skip


class StoreError(ValueError):
    """The results store cannot be opened, read or written; the message names its path."""


class ClaimError(RuntimeError):
    """A write to a cell the writer does not hold a claim on (it would overwrite another's)."""


def error_summary(error: str | None) -> str:
    """The last non-blank line of a failed cell's traceback (the exception and its message)."""
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no traceback recorded"


def config_key(config: Mapping) -> str:
    """SHA-256 of the config's canonical JSON (sorted keys): equal configs, equal keys."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def new_owner() -> str:
    """A fresh owner id for claims: "{hostname}:{pid}:{random hex}"."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (True when it cannot be told)."""
    if pid <= 0 or os.name == "nt":  # os.kill(pid, 0) is no probe on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, under another user
        return True
    return True


def claim_is_stale(owner: str | None, heartbeat: float | None, lease: float = LEASE) -> bool:
    """Whether a `running` claim can be taken over: no owner or heartbeat (a row of the old
    schema), a heartbeat older than `lease` seconds, or an owner process of this host that is
    not alive."""
    if owner is None or heartbeat is None or time.time() - heartbeat > lease:
        return True
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def _partial_tag(pid: int | None = None) -> str:
    """Names a partial file's writer: "{hostname}-{pid}" (dots in the hostname as "_")."""
    return f"{socket.gethostname().replace('.', '_')}-{os.getpid() if pid is None else pid}"


def _folder_writable(folder: Path) -> bool:
    """Whether files can be created in `folder`: writable for us and not marked read-only
    (no write bit at all, which root would otherwise ignore)."""
    return os.access(folder, os.W_OK) and bool(stat.S_IMODE(folder.stat().st_mode) & 0o222)


@contextmanager
def _staged(files: Mapping[Path, bytes]) -> Iterator[Callable[[], None]]:
    """Write `files` ({path: bytes}) to partial files beside their paths; the body calls the
    `place()` it is given to move them into place. Partial files left (an error, or no
    `place()`) are deleted."""
    partials = {}
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{path.name}.{_partial_tag()}.partial")
            partials[partial] = path
            partial.write_bytes(data)

        def place() -> None:
            for partial, path in partials.items():
                partial.replace(path)

        yield place
    finally:
        for partial in partials:
            partial.unlink(missing_ok=True)


def _check_regular(path: Path) -> None:
    """StoreError for a path that exists but is no regular file: a folder, a device
    (/dev/null), a FIFO; SQLite would write a journal beside it."""
    if path.is_dir():
        raise StoreError(f"{path} is a folder, not a results store file")
    if path.exists() and not path.is_file():
        raise StoreError(f"{path} is not a regular file (a device or a pipe?): not a results store")


class ResultsStore:
    """Rows of one grid in the SQLite file at `path`.

    Write mode (default) creates the file, its folder and the schema, and adds the columns of
    `ADDED_COLUMNS` to a store of an older schema. `readonly=True` only reads: a missing store
    is a FileNotFoundError, and nothing is created or changed (not even SQLite's -wal and -shm
    files); an SQLite file that is not a results store (no cells table of its columns, or
    empty) is a StoreError "PATH is not an attn_zoo results store: ...". A store that is not
    SQLite or is damaged raises StoreError naming the path. `owner` is the default
    owner of this handle's claims; `lease` the seconds after which a claim without heartbeat
    is stale."""

    draws_maps = True  # results/axes.py's CellSource: the maps files lie beside the store
    attention = None  # no maps carried over from a report

    def __init__(self, path: str | Path, readonly: bool = False, lease: float = LEASE):
        self.path = Path(path)
        self.readonly = readonly
        self.lease = lease
        self.owner = new_owner()
        self._local = threading.local()
        if readonly:
            self._target = self._read_only_target()
            self._check_is_store()
        else:
            _check_regular(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            writable = [self.path.parent, *([self.path] if self.path.exists() else [])]
            if not all(os.access(p, os.W_OK) for p in writable):  # a read-only mount, say
                raise StoreError(
                    f"{self.path} cannot be written: its file or folder is read-only (a "
                    "read-only mount?); ablate status and report can still read it"
                )
            if self.path.exists():  # a file of another kind is refused before it is touched
                probe = ResultsStore.__new__(ResultsStore)
                probe.path, probe.readonly, probe._local = self.path, True, threading.local()
                probe._target = f"file:{quote(str(self.path.resolve()))}?mode=ro"
                probe._check_is_store(creating=True)
            self._target = f"file:{quote(str(self.path.resolve()))}"
            with self._connect() as db:
                db.execute("PRAGMA journal_mode=WAL")
            with self._connect(write=True) as db:
                db.execute(SCHEMA)
                db.execute(GRIDS_SCHEMA)
                present = {row[1] for row in db.execute("PRAGMA table_info(cells)")}
                for column, kind in ADDED_COLUMNS.items():
                    if column not in present:
                        db.execute(f"ALTER TABLE cells ADD COLUMN {column} {kind}")

    def _read_only_target(self) -> str:
        """The URI that reads the store without creating or changing a file: FileNotFoundError
        for a missing store. With both the write-ahead log and its index beside it (a run has
        the store open, or was killed), SQLite reads through them; without them the store file
        is whole and is read as it is (immutable: SQLite would otherwise create the -wal and
        -shm files, and cannot in a read-only folder)."""
        _check_regular(self.path)
        if not self.path.is_file():
            raise FileNotFoundError(errno.ENOENT, "no results store", str(self.path))
        target = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        beside = [Path(f"{self.path}-{end}").exists() for end in ("wal", "shm")]
        if not all(beside) or not _folder_writable(self.path.parent):
            target += "&immutable=1"
        return target

    def _check_is_store(self, creating: bool = False) -> None:
        """StoreError "PATH is not an attn_zoo results store: ..." unless the file is an SQLite
        database with a cells table of the results store's columns; with `creating` (a write
        handle), an empty file or one without any table passes: another run may be creating
        the store this instant."""
        if self.path.stat().st_size == 0:
            if creating:
                return
            raise StoreError(f"{self.path} is not an attn_zoo results store: an empty file")
        with self._connect() as db:
            tables = sorted(
                name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            )
            columns = {row[1] for row in db.execute("PRAGMA table_info(cells)")}
        if creating and not tables:
            return
        if "cells" not in tables:
            held = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "") or "none"
            raise StoreError(
                f"{self.path} is not an attn_zoo results store: no cells table (tables: {held})"
            )
        lacking = sorted(STORE_COLUMNS - columns)
        if lacking:
            raise StoreError(
                f"{self.path} is not an attn_zoo results store: its cells table lacks the "
                f"columns {', '.join(lacking)}"
            )

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection; with `write`, the body is one BEGIN IMMEDIATE transaction (committed,
        or rolled back on an exception). A write handle keeps one connection per process and
        thread (`synchronous=NORMAL`: in WAL mode a commit survives a killed process, only a
        power cut can lose the last ones; `close` ends it); a read-only one opens a connection
        per call. sqlite3.DatabaseError becomes StoreError naming the path."""
        if write and self.readonly:
            raise StoreError(f"{self.path} is opened read-only: it cannot be written")
        try:
            db = self._kept() if not self.readonly else self._open()
            try:
                if write:
                    db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    if db.in_transaction:
                        db.rollback()
                    raise
                if db.in_transaction:
                    db.execute("COMMIT")
            finally:
                if self.readonly:
                    db.close()
        except sqlite3.DatabaseError as err:
            raise self._store_error(err) from err

    def _open(self) -> sqlite3.Connection:
        return sqlite3.connect(self._target, uri=True, timeout=TIMEOUT, isolation_level=None)

    def _kept(self) -> sqlite3.Connection:
        """This process's and thread's connection of a write handle (opened on first use, and
        again in a forked child)."""
        kept = getattr(self._local, "db", None)
        if kept is None or kept[0] != os.getpid():
            db = self._open()
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = kept = (os.getpid(), db)
        return kept[1]

    def close(self) -> None:
        """Close this thread's connection (a later call opens a new one): the last connection
        to close folds the write-ahead log into the store file."""
        kept = getattr(self._local, "db", None)
        self._local.db = None
        if kept is not None and kept[0] == os.getpid():
            kept[1].close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _store_error(self, err: sqlite3.DatabaseError) -> StoreError:
        name = getattr(err, "sqlite_errorname", "")
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            what = f"is locked by another process (waited {TIMEOUT:.0f} s)"
        elif name.startswith("SQLITE_READONLY"):
            what = "cannot be written (read-only file or folder?)"
        elif name.startswith("SQLITE_FULL"):
            what = "cannot be written: its disk is full"
        elif name.startswith("SQLITE_IOERR"):
            what = "cannot be read or written (a full disk, a file-size limit, a failing disk?)"
        else:
            what = "is not a readable results store"
        return StoreError(f"{self.path} {what}: {type(err).__name__}: {err}")

    # Claims -------------------------------------------------------------------------------

    def claim(
        self, config: Mapping, owner: str | None = None, *, retry_failed: bool = False
    ) -> str | None:
        """Claim the cell of `config` for `owner` (default: this handle's) in one transaction:
        its key, or None when it is done or diverged, failed (unless `retry_failed`), or held
        by another live claim. A claim marks the row running with a fresh heartbeat and
        clears any earlier outcome."""
        owner = owner or self.owner
        key = config_key(config)
        with self._connect(write=True) as db:
            row = db.execute(
                "SELECT status, owner, heartbeat FROM cells WHERE key=?", (key,)
            ).fetchone()
            if row is not None:
                status, holder, heartbeat = row
                claimable = (status == "failed" and retry_failed) or (
                    status == "running" and claim_is_stale(holder, heartbeat, self.lease)
                )
                if not claimable:
                    return None
            now = time.time()
            db.execute(
                "INSERT INTO cells (key, config, status, owner, heartbeat, started) "
                "VALUES (?, ?, 'running', ?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                "status='running', owner=excluded.owner, heartbeat=excluded.heartbeat, "
                "started=excluded.started, metrics=NULL, curve=NULL, environment=NULL, "
                "error=NULL, finished=NULL",
                (key, json.dumps(config, sort_keys=True, default=str), owner, now, now),
            )
        return key

    def heartbeat(self, keys: Iterable[str], owner: str | None = None) -> int:
        """Refresh the heartbeat of `owner`'s running claims among `keys`; how many it held."""
        owner = owner or self.owner
        rows = [(time.time(), key, owner) for key in keys]
        if not rows:
            return 0
        with self._connect(write=True) as db:
            return db.executemany(
                "UPDATE cells SET heartbeat=? WHERE key=? AND owner=? AND status='running'", rows
            ).rowcount

    def release(self, key: str, owner: str | None = None) -> bool:
        """Give back `owner`'s claim of `key` unfinished (its row is deleted, so any run can
        claim the cell at once); whether it was held."""
        owner = owner or self.owner
        with self._connect(write=True) as db:
            deleted = db.execute(
                "DELETE FROM cells WHERE key=? AND owner=? AND status='running'", (key, owner)
            ).rowcount
        return deleted == 1

    def finish(
        self,
        key: str,
        status: str,
        metrics: Mapping | None = None,
        curve: list | None = None,
        environment: Mapping | None = None,
        error: str | None = None,
        *,
        owner: str | None = None,
        files: Mapping[Path, bytes] | None = None,
    ) -> None:
        """Record the outcome of cell `key` in one transaction, only if `owner` (default: this
        handle's) still holds its claim; else ClaimError (it would overwrite another run's).
        `files` ({path: bytes}: `checkpoint_path(key)`, `maps_path(key)`) are written to
        partial files first and moved into place inside that transaction: a run that lost its
        claim writes nothing, and an error (a full disk) leaves no partial file. The cell's
        resume checkpoint (`resume_path(key)`) is deleted in it."""
        if status not in FINISHED:
            raise ValueError(f"status={status!r}: a finished cell is one of {FINISHED}")
        bad = [
            k for k, v in (metrics or {}).items() if isinstance(v, float) and not math.isfinite(v)
        ]
        if status == "done" and bad:
            raise ValueError(
                f"cell {key}: metrics {', '.join(bad)} are not finite; a result is done only if "
                "it is finite (record it as diverged)"
            )
        owner = owner or self.owner
        with _staged(files or {}) as place, self._connect(write=True) as db:
            row = db.execute("SELECT status, owner FROM cells WHERE key=?", (key,)).fetchone()
            if row is None:
                raise ClaimError(f"no cell {key} in {self.path}: claim it first")
            if row != ("running", owner):
                raise ClaimError(
                    f"cell {key} in {self.path} is {row[0]} and held by {row[1]}, not by "
                    f"{owner}: finishing it would overwrite another run's result"
                )
            db.execute(
                "UPDATE cells SET status=?, metrics=?, curve=?, environment=?, error=?, "
                "finished=? WHERE key=?",
                (status, json.dumps(metrics), json.dumps(curve), json.dumps(environment),
                 error, time.time(), key),
            )  # fmt: skip
            place()
            with suppress(FileNotFoundError, NotADirectoryError):  # none (a file for its folder)
                self.resume_path(key).unlink()  # a finished cell never resumes

    def save_resume(self, key: str, data: bytes, owner: str | None = None) -> bool:
        """Write cell `key`'s resume checkpoint (ablations.run.resume) to `resume_path(key)`: a
        partial file moved into place inside a transaction that finds the cell still running
        under `owner`'s claim (default: this handle's); whether it was written (a run that lost
        its claim writes nothing)."""
        owner = owner or self.owner
        with _staged({self.resume_path(key): data}) as place, self._connect(write=True) as db:
            row = db.execute("SELECT status, owner FROM cells WHERE key=?", (key,)).fetchone()
            if row != ("running", owner):
                return False
            place()
        return True

    # Checkpoints --------------------------------------------------------------------------

    def checkpoint_path(self, key: str) -> Path:
        """Where cell `key`'s trained weights are kept (grids with checkpoints = true)."""
        return self.path.parent / f"{self.path.stem}.checkpoints" / f"{key}.pt"

    def maps_path(self, key: str) -> Path:
        """Where cell `key`'s attention maps are kept (recorded when it finished, in grids with
        checkpoints = true; ablations.report.attention_maps draws them)."""
        return self.path.parent / f"{self.path.stem}.maps" / f"{key}.pt"

    def resume_path(self, key: str) -> Path:
        """Where cell `key`'s resume checkpoint is kept while it trains (`save_resume`; removed
        when it finishes)."""
        return self.path.parent / f"{self.path.stem}.resume" / f"{key}.pt"

    def remove_dead_partials(self) -> int:
        """Delete the partial checkpoint, maps and resume files that runs of this host which
        are no longer alive left behind (killed between writing them and recording their cell
        or moving them into place); how many."""
        removed = 0
        folders = [self.checkpoint_path("k"), self.maps_path("k"), self.resume_path("k")]
        for folder in (path.parent for path in folders):
            for partial in folder.glob("*.partial") if folder.is_dir() else ():
                tag = partial.name.rsplit(".", 2)[-2]
                pid = tag.rpartition("-")[2]
                if pid.isdigit() and tag == _partial_tag(int(pid)) and not pid_alive(int(pid)):
                    partial.unlink(missing_ok=True)
                    removed += 1
        return removed

    # Readers ------------------------------------------------------------------------------

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
        """Every row as a dict (JSON fields decoded), in the order the cells started."""
        with self._connect() as db:
            cursor = db.execute("SELECT * FROM cells ORDER BY started")
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:
            for field in ("config", "metrics", "curve", "environment"):
                row[field] = None if row[field] is None else json.loads(row[field])
            for column in ADDED_COLUMNS:  # a read-only store of the old schema lacks them
                row.setdefault(column, None)
            yield row

    def plugins(self) -> list[str]:
        """The plugins the cells were run with (each cell's environment records them,
        ablations/run/provenance.py), in the order first met."""
        environments = (row["environment"] or {} for row in self.rows())
        return list(dict.fromkeys(name for env in environments for name in env.get("plugins", {})))

    def record_axes(self, grid: str, axes: GridAxes) -> None:
        """Record grid `grid`'s axes (its swept keys and [selection]), replacing what an
        earlier version of the grid recorded."""
        with self._connect(write=True) as db:
            db.execute(
                "INSERT OR REPLACE INTO grids (name, axes) VALUES (?, ?)",
                (grid, json.dumps(axes.to_json(), sort_keys=True)),
            )

    def axes(self) -> dict[str, GridAxes]:
        """{grid name: GridAxes} as the runs of each grid recorded them ({} for a store written
        before they were); StoreError for a record that is not one."""
        with self._connect() as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
            rows = (
                db.execute("SELECT name, axes FROM grids").fetchall() if "grids" in tables else []
            )
        try:
            return axes_from_json({name: json.loads(axes) for name, axes in rows}, str(self.path))
        except ValueError as err:
            raise StoreError(str(err)) from None

    def to_dataframe(self) -> pd.DataFrame:
        """One row per cell, in the order the cells started: key, status, error, started,
        finished (`FRAME_COLUMNS`), then one column per config key named as `flat_config` names
        it (grid, task, task_name, task_kwargs.n_train, size, model.d_model, mechanism,
        mechanism_kwargs.n_heads, training.lr, seed, ...) and one per metric, behind "metrics."
        ("metrics.test_acc", "metrics.val_loss": a final metric never shares a name with a
        config key). A config key a cell does not have is missing there (NaN; `is_missing`);
        a config column of whole numbers with gaps has pandas' nullable "Int64" dtype (an int
        stays an int: 2, not 2.0). The learning curves are in `curves()`. An empty store gives
        the columns `FRAME_COLUMNS` and no rows.

            frame = ResultsStore("results/demo.sqlite", readonly=True).to_dataframe()
            frame.groupby(["mechanism", "training.lr"])["metrics.test_acc"].mean()
        """
        try:
            return cells_table(self.rows())
        except ValueError as err:
            raise StoreError(f"{self.path}: {err}") from None

    def curves(self) -> pd.DataFrame:
        """The learning curves of the cells, one row per cell and evaluated step, in the order
        the cells started (`CURVE_COLUMNS`): key (join on `to_dataframe()`'s), step, train_loss
        (the training batch's loss at that step), val_loss and val_metric (the validation loss
        and accuracy). A cell without a curve (failed, running) has no row; an empty store
        gives the columns and no rows.

            curves = store.curves().merge(store.to_dataframe()[["key", "mechanism"]], on="key")
            curves.pivot_table(index="step", columns="mechanism", values="val_metric")
        """
        points = []
        for row in self.rows():
            for point in row["curve"] or []:
                if len(point) != len(CURVE_FIELDS):
                    raise StoreError(
                        f"{self.path}: cell {row['key']}'s curve holds the point {point!r}, "
                        f"not [{', '.join(CURVE_FIELDS)}]"
                    )
                points.append([row["key"], *point])
        frame = pd.DataFrame(points, columns=list(CURVE_COLUMNS))
        return frame.astype({"step": "int64", **dict.fromkeys(CURVE_FIELDS[1:], "float64")})
