"""Reports under the ninth hostile pass (issue 38, no silent wrong answer), each as it failed:
a store holding one grid's cells twice (a renamed copy of the grid run into it) counted each
seed twice; differences equal up to float rounding read as a p-value's verdict; a [selection]
naming a pair or a metric twice counted one test twice in the Holm family; a mechanism that
diverged at every setting left the verdict table without a trace; the summary bolded a
mechanism's one surviving seed over one that finished every seed."""

from __future__ import annotations

import pandas as pd
import pytest
from grids import assert_refused, tiny_grid
from test_report_safety import add_done, config, section

from ablations.cli import main
from ablations.grid.schema import Selection
from ablations.report.build import write_report
from ablations.report.selection import paired, select, t_test_p, verdicts
from ablations.report.selection_section import selection_section
from ablations.report.tables import summary_table, task_table
from ablations.results.store import ResultsStore

LR = "training.lr"


def cells_of(accuracies: dict[str, list[float | None]], **labels) -> pd.DataFrame:
    """The report's tidy cells of one setting (training.lr 0.001): per mechanism, one cell per
    seed with that validation and test accuracy (None: the seed diverged)."""
    rows = [
        {"key": f"{mechanism}{seed}", "task": "t", "size": "s", "mechanism": mechanism,
         "seed": seed, "status": "diverged" if acc is None else "done", "val_acc": acc,
         "test_acc": acc, LR: "0.001"} | labels
        for mechanism, accs in accuracies.items()
        for seed, acc in enumerate(accs)
    ]  # fmt: skip
    return pd.DataFrame(rows)


# 1: one seed counted twice ------------------------------------------------------------------


def test_a_store_holding_a_grid_s_cells_twice_is_refused_naming_its_grids(tmp_path):
    """Grid g2, a renamed copy of g1, run into g1's store: its cells have other keys (the grid
    name keys a cell) but the same task, size, mechanism, setting and seed. The store's report
    counted 6 seeds of 3 (narrower intervals, a verdict flipped); it is refused naming the
    grids and how to report one. The report of one grid (its keys) counts each seed once."""
    path = tmp_path / "shared.sqlite"
    with ResultsStore(path) as store:
        keys = {
            grid: [add_done(store, config(grid=grid, seed=s), 0.9 + 0.01 * s) for s in range(3)]
            for grid in ("g1", "g2")
        }
    with pytest.raises(ValueError) as refused:
        write_report(path, tmp_path / "both")
    message = str(refused.value)
    assert "seed 0" in message and keys["g1"][0] in message and keys["g2"][0] in message
    assert "grids g1, g2" in message and "attn-zoo report GRID.toml" in message
    assert not (tmp_path / "both").exists()
    with pytest.raises(SystemExit) as cli:
        main(["report", str(path), "--out", str(tmp_path / "cli")])
    assert str(cli.value).startswith("error: ") and "grids g1, g2" in str(cli.value)
    one = write_report(path, tmp_path / "g1", keys=set(keys["g1"]))
    assert pd.read_csv(one / "summary.csv").seeds.tolist() == [3]


def test_select_and_paired_refuse_two_cells_of_one_seed():
    """Cells of two grids reported together: select averaged 6 cells of 3 seeds (n=6, a
    narrower interval) and paired paired over a duplicated seed index ('a ahead', p 0.003,
    where one grid's 3 seeds give no clear difference)."""
    accuracies = {"a": [0.90, 0.86, 0.93], "b": [0.87, 0.85, 0.90]}
    one = cells_of(accuracies, grid="g1")
    both = pd.concat([one, cells_of(accuracies, grid="g2").assign(key=lambda c: "2" + c.key)],
                     ignore_index=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"mechanism a, training.lr=0.001, seed 0: cells a0, 2a0"):
        select(both, [LR], "val_acc", "test_acc")
    chosen = select(one, [LR], "val_acc", "test_acc")
    assert chosen.n.tolist() == [3, 3]
    twice = chosen.assign(rows=[(*rows, *(r + 6 for r in rows)) for rows in chosen.rows])
    with pytest.raises(ValueError, match=r"mechanism a, training.lr=0.001, seed 0: cells a0, 2a0"):
        paired(both, twice, "a", "b", "test_acc")


# 2: the same difference on every seed, up to float rounding ---------------------------------


def test_differences_equal_up_to_float_rounding_read_as_the_same_on_every_seed():
    """Accuracies out of 1000 test items, a 41-item gap on every seed: the differences' sd is
    6e-17, not 0, and read 'a ahead' on a p of 8e-31 with a detectable ±2e-16."""
    cells = cells_of({"a": [0.953, 0.871, 0.902], "b": [0.912, 0.830, 0.861]})
    differences = pd.Series([0.953 - 0.912, 0.871 - 0.830, 0.902 - 0.861])
    assert 0 < differences.std() < 1e-15  # the premise: rounding, not a spread
    assert t_test_p(differences) == 0.0
    chosen = select(cells, [LR], "val_acc", "test_acc")
    (row,) = verdicts(paired(cells, chosen, "a", "b", "test_acc")).itertuples()
    assert row.verdict == (
        "a ahead on every seed by the same 0.041 (no spread: the t test does not apply)"
    )
    assert row.detectable == 0.0


# 3: one comparison counted twice in the family ----------------------------------------------


@pytest.mark.parametrize(
    ("selection", "fragments"),
    [
        ("compare = [['rel', 'std'], ['rel', 'std']]",
         ["selection.compare[1] = ['rel', 'std']", "selection.compare[0]"]),
        ("compare = [['rel', 'std'], ['std', 'rel']]",
         ["selection.compare[1] = ['std', 'rel']", "selection.compare[0]"]),
        ("reported = ['test_acc', 'test_loss', 'test_acc']",
         ["selection.reported[2] = 'test_acc'", "selection.reported[0]"]),
    ],
)  # fmt: skip
def test_a_selection_naming_a_pair_or_a_metric_twice_is_refused(tmp_path, selection, fragments):
    """Each copy was one more test in the Holm family: a p of 0.022 ('a ahead') became 0.089
    ('no clear difference'), with no error or note."""
    path = tiny_grid(tmp_path)
    path.write_text(path.read_text() + f"[selection]\n{selection}\n")
    assert_refused(path, fragments)


# 4: a mechanism without a finished setting --------------------------------------------------


def test_a_mechanism_that_diverged_at_every_setting_keeps_its_row_saying_why(tmp_path):
    """In task t2, b diverged at every learning rate on every seed: paired() skipped the pair,
    so paired.csv and the verdict table had t1's row only (the lead even said 'every row's
    task: t1')."""
    frames = []
    for task in ("t1", "t2"):
        for lr in ("0.001", "0.01"):
            b = [None] * 3 if task == "t2" else [0.80, 0.81, 0.82]
            cells = cells_of({"a": [0.85, 0.862, 0.878], "b": b}, task=task, **{LR: lr})
            frames.append(cells.assign(key=lambda c, t=task, r=lr: c.key + t + r))
    cells = pd.concat(frames, ignore_index=True)
    selected = selection_section(cells, Selection(over=[LR], compare=[["a", "b"]]), tmp_path)
    pairs = pd.read_csv(tmp_path / "paired.csv")
    assert pairs.task.tolist() == ["t1", "t2"] and pairs.n.tolist() == [3, 0]
    assert pairs.verdict[1] == "-" and pd.isna(pairs.p[1])
    lead, table = selected.verdicts
    assert "every row's task" not in lead.text
    assert table.data.task.tolist() == ["t1", "t2"]
    assert table.data.why.tolist() == [
        "",
        "b: no eligible setting (training.lr=0.001: 3 of 3 seeds diverged; "
        "training.lr=0.01: 3 of 3 seeds diverged)",
    ]


# 5: the summary's best among rows whose every seed finished ---------------------------------


def test_the_summary_bolds_no_best_of_a_row_whose_seeds_did_not_all_finish():
    """'fragile' diverged on 2 of 3 seeds, its one survivor 0.97: it was bolded as the best over
    'steady', 0.95 [0.94, 0.96] on 3 of 3 (survivor bias; the seeds column said '1 of 3')."""
    cells = cells_of({"steady": [0.95, 0.945, 0.955], "fragile": [0.97, None, None]})
    cells = cells.assign(batch_size=32, early_stop_target=None, params=1000, step_ms=1.0,
                         diverged_at=None, contended=False, setting="")  # fmt: skip
    table = task_table(summary_table(cells, None))
    bold = dict(zip(table.data.mechanism, table.bold["test acc [95% CI]"], strict=True))
    assert bold == {"steady": True, "fragile": False}


# 6: the training-set size table's best among mechanisms whose every seed finished ------------


def test_the_training_set_size_table_bolds_no_survivor_and_counts_the_cells_not_done(tmp_path):
    """At n_train 128 'fragile' diverged on 2 of 3 seeds, its survivor 0.99: the table showed
    it bold as '0.990 (n=1)' over 'steady' 0.95 on 3 of 3, with nothing saying two seeds were
    lost (the table was built from the finished cells only)."""
    store = ResultsStore(tmp_path / "sizes.sqlite")
    for n_train in (64, 128):
        for mechanism in ("steady", "fragile"):
            for seed in range(3):
                cell = config(mechanism=mechanism, seed=seed)
                cell["task_kwargs"] = cell["task_kwargs"] | {"n_train": n_train}
                if mechanism == "fragile" and n_train == 128 and seed > 0:
                    store.finish(store.claim(cell), "diverged", {"diverged_at": 5}, [], {})
                else:
                    accuracy = 0.99 if mechanism == "fragile" else 0.95 + 0.001 * seed
                    add_done(store, cell, accuracy if n_train == 128 else 0.8)
    markdown = (write_report(store, tmp_path / "out") / "report.md").read_text()
    text = section(markdown, "## Training-set size: same_pair")
    row = next(line for line in text.splitlines() if line.startswith("| 128 |"))
    steady, fragile = (cell.strip() for cell in row.split("|")[3:5])
    assert fragile == "0.990 (n=1 of 3)" and not fragile.startswith("**")
    assert steady.startswith("**0.951 \\[") and steady.endswith("(n=3)**")
    assert "among those whose every seed finished" in text


# 7: a tie between settings is told, and an interior tie is no sweep's edge ------------------


def test_a_tie_between_learning_rates_is_told_and_raises_no_edge_flag():
    """Every seed reached accuracy 1.0 at lr 0.001 and 0.003: the first tried (0.001, the
    lowest) was chosen as if it were best and flagged "the lowest tried" (widen the sweep),
    though 0.003, inside the sweep, is as good."""
    cells = pd.concat(
        [cells_of({"a": [acc] * 3}, **{LR: lr}) for lr, acc in
         (("0.001", 1.0), ("0.003", 1.0), ("0.01", 0.9))],
        ignore_index=True,
    )  # fmt: skip
    [row] = select(cells, [LR], "val_acc", "test_acc").to_dict("records")
    assert row["best"] == f"{LR}=0.001" and row["tied"] == f"{LR}=0.003" and row["edge"] == ""
    lowest_only = cells[cells[LR] != "0.003"]  # a tie at the edges only stays flagged
    edge_tie = pd.concat([lowest_only, cells_of({"a": [1.0] * 3}, **{LR: "0.03"})])
    [row] = select(edge_tie, [LR], "val_acc", "test_acc").to_dict("records")
    assert row["tied"] == f"{LR}=0.03" and row["edge"] == f"{LR}=0.001 the lowest tried"
    [row] = select(cells[cells[LR] != "0.003"], [LR], "val_acc", "test_acc").to_dict("records")
    assert row["tied"] == "" and row["edge"] == f"{LR}=0.001 the lowest tried"
