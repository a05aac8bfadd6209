"""ablations.run.overlap: how many evaluation examples a cell's training split already holds."""

import csv

import torch
from grids import SAME_PAIR, tiny_grid

from ablations.run.overlap import main, split_overlap
from ablations.tasks.registry import Split


def test_counts_the_evaluation_inputs_found_verbatim_among_the_training_inputs_per_class():
    splits = {
        "train": Split(torch.tensor([[1, 2], [3, 3], [3, 3]]), torch.tensor([0, 1, 1])),
        "validation": Split(
            torch.tensor([[2, 1], [3, 3], [1, 2], [4, 4]]), torch.tensor([0, 1, 0, 1])
        ),
        "test": Split(torch.tensor([[5, 5]]), torch.tensor([1])),
    }
    rows = split_overlap(splits, per_class=True)
    got = {(r["split"], r["class"]): (r["n"], r["seen"], r["fraction"]) for r in rows}
    # [2, 1] is [1, 2] reversed: another input; [3, 3] is seen, [4, 4] and [5, 5] are not
    assert got == {
        ("validation", 0): (2, 1, 0.5),
        ("validation", 1): (2, 1, 0.5),
        ("test", 1): (1, 0, 0.0),
    }
    pooled = split_overlap(splits, per_class=False)
    assert [(r["split"], r["class"], r["n"], r["seen"]) for r in pooled] == [
        ("validation", "all", 4, 2),
        ("test", "all", 1, 0),
    ]


def test_float_inputs_compare_by_value_and_an_empty_split_has_no_fraction():
    train = Split(torch.tensor([[0.25, 0.5]]), torch.tensor([0]))
    test = Split(torch.tensor([[0.25, 0.5], [0.25, 0.5000001]]), torch.tensor([0, 0]))
    empty = Split(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
    rows = split_overlap({"train": train, "test": test, "validation": empty}, per_class=False)
    assert [(r["split"], r["n"], r["seen"], r["fraction"]) for r in rows] == [
        ("test", 2, 1, 0.5),
        ("validation", 0, 0, ""),
    ]


def test_the_command_writes_a_row_per_task_setting_seed_split_and_class(tmp_path):
    # 2 tokens: (0, 0), (1, 1), (0, 1) and (1, 0) all occur among 128 training pairs
    task = {**SAME_PAIR, "kwargs": {**SAME_PAIR["kwargs"], "vocab_size": 2}}
    path = tiny_grid(tmp_path, tasks=[{**task, "sweep": {"task_kwargs.n_train": [64, 128]}}])
    out = tmp_path / "overlap.csv"
    assert main([str(path), "--set", "seeds=[0, 1, 2]", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    settings = {(r["task_kwargs"], r["seed"]) for r in rows}
    assert len(settings) == 2 * 3  # one per n_train and seed, not per mechanism
    assert {(r["split"], r["class"]) for r in rows} == {
        (split, c) for split in ("validation", "test") for c in ("0", "1")
    }
    assert len(rows) == 6 * 4
    assert all(r["seen"] == r["n"] and float(r["fraction"]) == 1.0 for r in rows)


def test_a_label_a_spreadsheet_would_run_is_written_as_text(tmp_path):
    """The eleventh hostile pass: a task label '=HYPERLINK(...)' went into the CSV as it is."""
    label = '=HYPERLINK("http://x", "y")'
    path = tiny_grid(tmp_path, seeds=[0], tasks=[{**SAME_PAIR, "label": label}])
    out = tmp_path / "overlap.csv"
    assert main([str(path), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert rows and {r["task"] for r in rows} == {"'" + label}
