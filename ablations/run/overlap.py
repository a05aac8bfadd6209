"""How much of a grid's evaluation data its cells' training splits already hold.

For every task setting and seed the grid's cells train on: the number and fraction of
validation and test examples whose input occurs verbatim among the training inputs, per class
for a classification task (a model may score those by memory, not by what the task asks).

    python -m ablations.run.overlap GRID [--set KEY=VALUE ...] --out CSV

One CSV row per (task, task setting, seed, split, class): columns task (a label a spreadsheet
would run as a formula behind a "'", as the reports' CSVs write it), task_kwargs (JSON, keys
sorted), seed, split, class ("all" where a task's targets are not one class per
example), n, seen, fraction (seen / n; empty where n is 0). The data is made as training makes
it (`Task.splits(seed)`: ablations.run.train), so a CSV written here describes the cells.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

from torch import Tensor

from ablations.grid.spec import load_grid
from ablations.labels import csv_text
from ablations.tasks.registry import Split, Task

FIELDS = ("task", "task_kwargs", "seed", "split", "class", "n", "seen", "fraction")


def row_bytes(inputs: Tensor) -> list[bytes]:
    """Each example of `inputs` ``(n, ...)`` as the bytes of its values (equal bytes: equal
    inputs of one dtype)."""
    flat = inputs.reshape(len(inputs), math.prod(inputs.shape[1:])).contiguous().cpu().numpy()
    return [row.tobytes() for row in flat]


def split_overlap(splits: dict[str, Split], per_class: bool) -> list[dict]:
    """Per split other than "train", and per class where `per_class` (targets ``(n,)``, one
    class id each), how many examples (`n`) have an input found among the training inputs
    (`seen`), and the fraction."""
    train = set(row_bytes(splits["train"].inputs))
    rows = []
    for name, split in splits.items():
        if name == "train":
            continue
        seen = [key in train for key in row_bytes(split.inputs)]
        groups = {"all": list(range(len(seen)))}
        if per_class:
            classes = split.targets.tolist()
            groups = {c: [i for i, t in enumerate(classes) if t == c] for c in sorted(set(classes))}
        for label, indices in groups.items():
            hits = sum(seen[i] for i in indices)
            fraction = hits / len(indices) if indices else ""
            rows.append(
                {
                    "split": name,
                    "class": label,
                    "n": len(indices),
                    "seen": hits,
                    "fraction": fraction,
                }
            )
    return rows


def task_overlap(task: Task, seed: int) -> list[dict]:
    """`split_overlap` of `task`'s splits for `seed`, per class for a classification task."""
    per_class = task.kind in ("classification", "image_classification")
    return split_overlap(task.splits(seed), per_class)


def grid_overlap(grid: str | Path, overrides: list[str] | None = None) -> list[dict]:
    """The CSV's rows for every distinct (task label, task kwargs, seed) of the grid's cells."""
    spec = load_grid(grid, overrides, check_device=False)
    settings = {}
    for cell in spec.cells:
        kwargs = json.dumps(cell.task_kwargs, sort_keys=True)
        settings.setdefault((cell.task, kwargs, cell.seed), cell)
    rows = []
    for (label, kwargs, seed), cell in sorted(settings.items()):
        for row in task_overlap(cell.build_task(), seed):
            rows.append({"task": label, "task_kwargs": kwargs, "seed": seed, **row})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ablations.run.overlap", description=__doc__.splitlines()[0]
    )
    parser.add_argument("grid", help="the grid file")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a grid override"
    )
    parser.add_argument("--out", required=True, help="the CSV to write (replaced)")
    args = parser.parse_args(argv)
    try:
        rows = grid_overlap(args.grid, args.set)
    except ValueError as err:  # a SpecError is a ValueError
        sys.exit(f"error: {err}")
    with open(args.out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, FIELDS)
        writer.writeheader()
        writer.writerows({k: csv_text(v) for k, v in row.items()} for row in rows)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
