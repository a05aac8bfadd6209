"""Run-to-run variance (ablations/bench/variance.py): two stores of the same grid, written by real
runs, compared cell by cell."""

import json
import sqlite3

import pandas as pd
import pytest
from grids import STD, tiny_grid

from ablations.bench.variance import compare, main
from ablations.grid.spec import load_grid
from ablations.run.runner import run_grid


def test_two_runs_compared_cell_by_cell(tmp_path):
    path = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0, 1])
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    run_grid(load_grid(path, [f"store={a}"]), workers=1)
    run_grid(load_grid(path, [f"store={b}", "seeds=[1]"]), workers=1)  # seed 0 only in a
    main([str(a), str(b), "--out", str(tmp_path / "same")])
    cells = pd.read_csv(tmp_path / "same" / "by_cell.csv")
    assert list(cells.seed) == [1] and (cells.threads_a == cells.threads_b).all()
    assert (cells.filter(like="_diff") == 0).all().all()  # the same seed and threads: same bits
    with sqlite3.connect(b) as db:  # a result of run b that moved by 0.25
        (metrics,) = db.execute("SELECT metrics FROM cells").fetchone()
        moved = {**json.loads(metrics), "test_acc": json.loads(metrics)["test_acc"] - 0.25}
        db.execute("UPDATE cells SET metrics=?", (json.dumps(moved),))
    main([str(a), str(b), "--out", str(tmp_path / "moved")])
    summary = pd.read_csv(tmp_path / "moved" / "summary.csv").set_index("metric")
    assert summary.loc["test_acc", "max_abs_diff"] == pytest.approx(0.25)
    assert summary.loc["test_acc", "identical"] == 0 and summary.loc["val_acc", "identical"] == 1


def test_the_thread_count_is_the_grids_whatever_the_workers(tmp_path):
    """One worker (a thread of the driver) and two worker processes train every cell with the
    grid's one torch thread, so the two runs agree to the bit."""
    path = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0, 1])
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    run_grid(load_grid(path, [f"store={a}"]), workers=1)
    run_grid(load_grid(path, [f"store={b}"]), workers=2)
    cells, summary = compare(a, b)
    assert len(cells) == 2 and (cells.threads_a == 1).all() and (cells.threads_b == 1).all()
    assert (summary.identical == summary.cells).all()
