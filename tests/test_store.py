"""The results store: keys, statuses, export, no row lost or duplicated under SIGKILL, read-only
opening that writes nothing, corrupt stores named, and stores of the old schema migrated."""

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from grids import REL, STD, tiny_grid

from ablations.grid.spec import load_grid
from ablations.results.frames import is_missing, keep_whole_numbers
from ablations.results.store import ClaimError, ResultsStore, StoreError, config_key

REPO = Path(__file__).resolve().parents[1]

# The schema of the stores written before claims (no owner, no heartbeat).
OLD_SCHEMA = """
CREATE TABLE cells (
    key TEXT PRIMARY KEY, config TEXT NOT NULL, status TEXT NOT NULL, metrics TEXT, curve TEXT,
    environment TEXT, error TEXT, started REAL, finished REAL
)
"""


def test_keys_are_canonical():
    assert config_key({"a": 1, "b": [1, 2]}) == config_key({"b": [1, 2], "a": 1})
    assert config_key({"a": 1}) != config_key({"a": 2})


def test_lifecycle_and_dataframe(tmp_path):
    store = ResultsStore(tmp_path / "grid" / "results.sqlite")
    done = {"task": "same_pair", "seed": 0}
    failed = {"task": "same_pair", "seed": 1}
    key = store.claim(done)
    assert store.status(done) == "running" and store.finished_keys() == set()
    curve = [[10, 0.7, 0.6, 0.5], [20, 0.4, 0.3, 0.9]]
    store.finish(key, "done", metrics={"acc": 0.9}, curve=curve, environment={"torch": "x"})
    store.finish(store.claim(failed), "failed", error="Traceback ...")
    assert store.status(done) == "done" and store.status({"seed": 9}) is None
    assert store.finished_keys() == {config_key(done), config_key(failed)}
    frame = store.to_dataframe()
    assert list(frame.status) == ["done", "failed"]
    assert frame.loc[0, "metrics.acc"] == 0.9 and frame.loc[1, "seed"] == 1
    assert frame.loc[1, "error"] == "Traceback ..." and frame.loc[1, "task"] == "same_pair"
    assert store.curves().drop(columns="key").values.tolist() == curve  # the failed cell: none
    assert {row["owner"] for row in store.rows()} == {store.owner}
    with pytest.raises(ValueError, match="status='running'"):
        store.finish(key, "running")
    with pytest.raises(ClaimError, match="claim it first"):
        store.finish("nope", "done")
    assert store.claim(done) is None  # a done cell is never claimed again


def test_an_empty_store_has_its_tables_columns(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    frame, curves = store.to_dataframe(), store.curves()
    assert frame.empty and list(frame.columns) == ["key", "status", "error", "started", "finished"]
    assert curves.empty
    assert list(curves.columns) == ["key", "step", "train_loss", "val_loss", "val_metric"]


def test_the_cells_table_has_one_flat_column_per_config_key_and_metric(tmp_path):
    path = tiny_grid(tmp_path, seeds=[0], mechanisms=[STD, REL])
    path.write_text(path.read_text() + "[sweep]\ntraining.patience = [0, 2]\n")
    cells = load_grid(path).cells
    store = ResultsStore(tmp_path / "tiny.sqlite")
    for i, cell in enumerate(cells):
        store.finish(store.claim(cell.config()), "done", {"val_loss": 0.5 + i, "steps": 20})
    frame = store.to_dataframe().set_index("key")
    assert len(frame) == len(cells) == 4
    assert not any(isinstance(v, dict) for v in frame.to_numpy().ravel())  # flat, no tables
    assert not [c for c in frame if c.startswith("config")]
    for i, cell in enumerate(cells):
        row = frame.loc[cell.key]
        assert (row["task"], row["size"], row["mechanism"], row["seed"]) == (
            cell.task, cell.size["label"], cell.mechanism, cell.seed
        )  # fmt: skip
        assert row["training.lr"] == cell.training.lr
        assert row["task_kwargs.n_train"] == cell.task_kwargs["n_train"]
        assert row["mechanism_kwargs.n_heads"] == cell.mechanism_kwargs["n_heads"]
        assert row["model.d_model"] == cell.size["d_model"]
        assert row["metrics.val_loss"] == 0.5 + i and row["metrics.steps"] == 20
        retrieval = cell.mechanism_kwargs.get("symbol_retrieval_kwargs", {}).get("max_length")
        given = row["mechanism_kwargs.symbol_retrieval_kwargs.max_length"]
        assert given == retrieval if retrieval else is_missing(given)
        keyed = cell.config()["training"]
        assert row["training.patience"] == 2 if "patience" in keyed else is_missing(
            row["training.patience"]
        )  # fmt: skip
    # whole numbers that only some cells have stay whole (pandas would make them 2.0)
    assert str(frame["training.patience"].dtype) == "Int64"
    assert str(frame["mechanism_kwargs.symbol_retrieval_kwargs.max_length"].dtype) == "Int64"


def test_the_curves_table_has_a_row_per_cell_and_evaluated_step(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    stored = {
        store.claim({"seed": 0}): [[10, 0.9, 0.8, 0.25], [20, 0.5, 0.4, 0.75]],
        store.claim({"seed": 1}): [[10, float("nan"), 0.7, 0.5]],
    }
    for key, curve in stored.items():
        store.finish(key, "done" if len(curve) > 1 else "diverged", {}, curve)
    store.finish(store.claim({"seed": 2}), "failed", error="Traceback ...")
    curves = store.curves()
    expected = [[key, *point] for key, curve in stored.items() for point in curve]
    got = curves.to_numpy().tolist()
    assert [row[:2] for row in got] == [row[:2] for row in expected]
    assert pd.DataFrame(got).iloc[:, 2:].equals(pd.DataFrame(expected).iloc[:, 2:])  # NaN too
    assert curves.step.dtype == "int64" and (curves.dtypes.iloc[2:] == "float64").all()
    # joined with the cells' table on key
    joined = curves.merge(store.to_dataframe()[["key", "seed"]], on="key")
    assert list(joined.seed) == [0, 0, 1]


def test_a_table_that_cannot_be_made_is_refused_with_the_cell_named(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    key = store.claim({"status": "mine"})
    store.finish(key, "done", {}, [[10, 0.5]])
    with pytest.raises(StoreError, match=f"cell {key}'s config has the keys status"):
        store.to_dataframe()
    with pytest.raises(StoreError, match=rf"cell {key}'s curve holds the point \[10, 0.5\]"):
        store.curves()


WRITER = textwrap.dedent(
    """
    import sys, time
    from ablations.results.store import ResultsStore
    store = ResultsStore(sys.argv[1])
    for seed in range(1_000):
        key = store.claim({"seed": seed})
        if key is None:
            continue
        print(seed, flush=True)
        store.finish(key, "done", metrics={"seed": seed})
    """
)


def test_sigkill_midway_then_resume_loses_and_duplicates_nothing(tmp_path):
    path = tmp_path / "r.sqlite"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    for _ in range(50):  # let it record some cells, then kill it without warning
        writer.stdout.readline()
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    store = ResultsStore(path)
    before = store.to_dataframe()
    done_before = set(before[before.status == "done"]["seed"])
    assert len(done_before) >= 49 and before.key.is_unique
    resumed = subprocess.run(
        [sys.executable, "-c", WRITER, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    rerun = {int(line) for line in resumed.stdout.split()}
    assert rerun.isdisjoint(done_before)  # finished cells are skipped
    # the cell the killed writer held (if any) was taken over: its owner is dead
    assert set(before[before.status == "running"]["seed"]) <= rerun
    after = store.to_dataframe()
    assert after.key.is_unique and len(after) == 1_000 and set(after.status) == {"done"}
    assert (after["metrics.seed"] == after["seed"]).all()


# Read-only opening ------------------------------------------------------------------------


def filled_store(path: Path, cells: int = 3) -> ResultsStore:
    store = ResultsStore(path)
    for seed in range(cells):
        store.finish(store.claim({"seed": seed}), "done", metrics={"seed": seed})
    store.close()  # as a finished run does: the write-ahead log folded into the file
    return store


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_a_read_only_store_is_read_and_left_untouched(tmp_path):
    folder = tmp_path / "grid"
    path = folder / "results.sqlite"
    filled_store(path)
    before = snapshot(folder)
    assert list(before) == ["results.sqlite"]
    path.chmod(0o444)
    folder.chmod(0o555)  # root ignores these bits: the store must not rely on them to stop it
    try:
        store = ResultsStore(path, readonly=True)
        assert store.status({"seed": 1}) == "done" and len(store.finished_keys()) == 3
        frame = store.to_dataframe()
        assert list(frame["metrics.seed"]) == [0, 1, 2]
        with pytest.raises(StoreError, match="read-only"):
            store.claim({"seed": 7})
        with pytest.raises(StoreError, match="read-only"):
            store.finish(config_key({"seed": 1}), "failed")
        assert snapshot(folder) == before  # same bytes and mtime, no -wal or -shm file
    finally:
        folder.chmod(0o755)
        path.chmod(0o644)


def test_read_only_opening_sees_rows_still_in_the_write_ahead_log(tmp_path):
    store = filled_store(tmp_path / "r.sqlite", cells=1)
    live = sqlite3.connect(store.path)  # another connection keeps the WAL from being folded in
    live.execute("SELECT count(*) FROM cells").fetchall()
    try:
        store.finish(store.claim({"seed": 5}), "diverged", metrics={"diverged_at": 3})
        assert Path(f"{store.path}-wal").stat().st_size > 0
        reader = ResultsStore(store.path, readonly=True)
        assert reader.status({"seed": 5}) == "diverged" and len(list(reader.rows())) == 2
    finally:
        live.close()


def test_read_only_opening_of_a_missing_store_creates_nothing(tmp_path):
    for path in (tmp_path / "results.sqlite", tmp_path / "no" / "such" / "results.sqlite"):
        with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
            ResultsStore(path, readonly=True)
    assert list(tmp_path.iterdir()) == []


# Corrupt stores ---------------------------------------------------------------------------


def corrupt_stores(folder: Path) -> list[Path]:
    """A text file named results.sqlite, and a real store cut to half its size."""
    text = folder / "text" / "results.sqlite"
    text.parent.mkdir()
    text.write_text("key,status\nabc,done\n" * 20)
    truncated = folder / "truncated" / "results.sqlite"
    store = ResultsStore(truncated)
    for seed in range(200):
        store.finish(store.claim({"seed": seed}), "done", curve=[[step, 0.5] for step in range(20)])
    store.close()
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    return [text, truncated]


@pytest.mark.parametrize("readonly", [False, True])
def test_a_corrupt_store_is_one_error_naming_its_path(tmp_path, readonly):
    for path in corrupt_stores(tmp_path):
        data = path.read_bytes()
        with pytest.raises(StoreError, match="not a readable results store") as caught:
            ResultsStore(path, readonly=readonly).to_dataframe()
        assert str(path) in str(caught.value) and isinstance(caught.value, ValueError)
        assert path.read_bytes() == data


def test_read_only_opening_of_an_sqlite_file_without_cells_is_a_store_error(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    with pytest.raises(
        StoreError, match=re.escape(f"{path} is not an attn_zoo results store: no cells table")
    ):
        ResultsStore(path, readonly=True)


# Old schema -------------------------------------------------------------------------------


def test_a_store_of_the_old_schema_is_migrated_and_still_reads(tmp_path):
    path = tmp_path / "old.sqlite"
    done, running = {"seed": 0}, {"seed": 1}
    with sqlite3.connect(path) as db:
        db.execute(OLD_SCHEMA)
        db.execute(
            "INSERT INTO cells VALUES (?, ?, 'done', '{\"acc\": 1.0}', '[]', '{}', NULL, 1.0, 2.0)",
            (config_key(done), '{"seed": 0}'),
        )
        db.execute(
            "INSERT INTO cells (key, config, status, started) VALUES (?, ?, 'running', 3.0)",
            (config_key(running), '{"seed": 1}'),
        )
    db.close()

    reader = ResultsStore(path, readonly=True)  # read as it is: no migration
    assert [row["owner"] for row in reader.rows()] == [None, None]
    with sqlite3.connect(path) as db:
        assert "owner" not in {row[1] for row in db.execute("PRAGMA table_info(cells)")}
    db.close()

    store = ResultsStore(path)
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(cells)")}
    db.close()
    assert {"owner", "heartbeat"} <= columns
    assert ResultsStore(path).status(done) == "done"  # opening a migrated store again is fine
    frame = store.to_dataframe()
    assert list(frame.status) == ["done", "running"] and frame.loc[0, "metrics.acc"] == 1.0
    assert store.claim(done) is None  # a finished row of the old schema stays as it is
    assert store.claim(running) == config_key(running)  # a running one has no live owner


def test_whole_numbers_with_gaps_stay_whole_within_int64_and_floats_beyond():
    frame = pd.DataFrame({"small": [4, None], "huge": [2**63, None], "mixed": [4, 0.5]})
    keep_whole_numbers(frame, {"small": [4, None], "huge": [2**63, None], "mixed": [4, 0.5]})
    assert str(frame.small.dtype) == "Int64" and frame.small.tolist()[0] == 4
    assert frame.huge.dtype.kind == "f" and frame.mixed.dtype.kind == "f"  # no OverflowError
