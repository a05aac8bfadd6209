"""Reports under the eleventh hostile pass (issue 38, no silent wrong answer), each as it
failed: a comparison over a seed one mechanism never ran (a store whose grid's missing cells
nobody listed, or a cells.csv rebuilt with --grid) gave a verdict over the seeds both held."""

from __future__ import annotations

import json
import sqlite3

import pandas as pd
from grids import REL, STD, tiny_grid
from test_report_hostile9 import cells_of

from ablations.cli import main
from ablations.report.selection import paired, select, verdicts

SELECTION = '\n[selection]\nmetric = "val_acc"\nreported = "test_acc"\ncompare = [["rel", "std"]]\n'


def test_a_comparison_over_a_seed_one_mechanism_lacks_is_incomplete_not_a_verdict():
    """rel has seeds 0 and 1, std 0, 1 and 2 (rel's seed 2 never started: no cell): the
    verdict was "relational ahead" over n = 2; it is incomplete, naming the seed."""
    cells = cells_of({"rel": [0.80, 0.83], "std": [0.70, 0.72, 0.74]})
    chosen = select(cells, ["training.lr"], "val_acc", "test_acc")
    pairs = verdicts(paired(cells, chosen, "rel", "std", "test_acc"))
    (row,) = pairs.itertuples()
    assert row.incomplete == "rel: no cell of seed 2, which the other has (not run)"
    assert row.verdict.startswith("incomplete (rel: no cell of seed 2") and pd.isna(row.p)
    full = cells_of({"rel": [0.80, 0.83, 0.81], "std": [0.70, 0.72, 0.74]})
    (row,) = verdicts(paired(full, select(full, ["training.lr"], "val_acc", "test_acc"),
                             "rel", "std", "test_acc")).itertuples()  # fmt: skip
    assert row.incomplete == "" and row.p < 0.05


def test_a_cells_csv_rebuilt_with_its_grid_lists_the_grids_cells_it_lacks_as_not_run(tmp_path):
    """A grid's cells.csv missing a cell (an interrupted run, reported from its store):
    rebuilt with --grid it gave the store's verdict over the seeds both held; with --grid the
    grid's cells it lacks are listed as not run, as the report of the grid file lists them."""
    path = tiny_grid(tmp_path, seeds=[0, 1, 2], mechanisms=[STD, REL],
                     training={"steps": 4, "eval_every": 2})  # fmt: skip
    path.write_text(path.read_text() + SELECTION)
    assert main(["ablate", "run", str(path), "--workers", "1"]) == 0
    with sqlite3.connect(tmp_path / "tiny.sqlite") as con:
        rows = con.execute("select key, config from cells").fetchall()
        (gone,) = [k for k, c in rows if json.loads(c)["mechanism"] == "rel"
                   and json.loads(c)["seed"] == 2]  # fmt: skip
        con.execute("delete from cells where key = ?", (gone,))
    main(["report", str(tmp_path / "tiny.sqlite"), "--out", str(tmp_path / "store")])
    rebuilt = tmp_path / "rebuilt"
    cells = str(tmp_path / "store" / "cells.csv")
    assert main(["report", cells, "--grid", str(path), "--out", str(rebuilt)]) == 0
    (row,) = pd.read_csv(rebuilt / "paired.csv").itertuples()
    assert row.incomplete == "rel: 1 cells running or not run"
    assert (
        "not run: a cell of the grid that the store does not hold"
        in (rebuilt / "report.md").read_text()
    )


def test_a_verdict_resting_on_a_tie_in_the_selection_says_so():
    """rel's validation accuracy ties at two rates; the first tried (test 0.508) was taken
    over the other (0.962) and the verdict read "std ahead on every seed" with no caveat (the
    tie showed in the selection table only): the verdict and paired.csv now name the tie."""
    low = cells_of({"rel": [0.5, 0.5, 0.5], "std": [0.9, 0.9, 0.9]})
    high = cells_of({"rel": [0.5, 0.5, 0.5]}).assign(**{"training.lr": "0.01"})
    cells = pd.concat([low, high], ignore_index=True)
    cells["key"] = [f"cell{i}" for i in range(len(cells))]
    cells["test_acc"] = [0.508, 0.51, 0.506, 0.9, 0.91, 0.9, 0.962, 0.96, 0.963]
    chosen = select(cells, ["training.lr"], "val_acc", "test_acc")
    (row,) = verdicts(paired(cells, chosen, "rel", "std", "test_acc")).itertuples()
    assert row.tied == "rel at training.lr=0.001 tied with training.lr=0.01"
    assert row.verdict.startswith("std ahead")
    assert row.verdict.endswith(
        "; rests on a tie in the selection (rel at training.lr=0.001 tied with "
        "training.lr=0.01: the first tried is taken)"
    )
    untied = cells.assign(val_acc=cells.val_acc.where(cells.index < 6, 0.4))
    (row,) = verdicts(paired(untied, select(untied, ["training.lr"], "val_acc", "test_acc"),
                             "rel", "std", "test_acc")).itertuples()  # fmt: skip
    assert row.tied == "" and "tie" not in row.verdict
