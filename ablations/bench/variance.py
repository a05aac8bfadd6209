"""Run-to-run variance: the same cells trained in two runs (again, or with another number of
torch threads), compared cell by cell.

    python -m ablations.bench.variance A.sqlite B.sqlite --out reports/thread_variance

Writes `by_cell.csv`: one row per cell done in both stores (its key, task, size, mechanism, seed,
each run's torch threads, and every final metric of both runs: `<metric>_a`, `<metric>_b`,
`<metric>_diff` = b - a), and `summary.csv`: per metric, the cells compared, how many are
bitwise identical, and the median and largest |b - a|. On the CPU the same seed and the same
threads give the same bits (tests/test_train.py); another thread count changes the order of
floating-point sums, and how far that moves a result is what this measures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from ablations.results.store import ResultsStore

LABELS = ["key", "task", "size", "mechanism", "seed"]
METRICS = ["val_loss", "val_acc", "test_loss", "test_acc"]


def done_cells(path: str | Path) -> pd.DataFrame:
    """The done cells of the store at `path`: labels, torch threads and `METRICS`, by key."""
    rows = []
    for row in ResultsStore(path, readonly=True).rows():
        if row["status"] != "done":
            continue
        config, metrics = row["config"], row["metrics"] or {}
        rows.append({
            "key": row["key"], "task": config["task"], "size": config["size"]["label"],
            "mechanism": config["mechanism"], "seed": config["seed"],
            "threads": (row["environment"] or {}).get("threads"),
            **{m: metrics.get(m) for m in METRICS},
        })  # fmt: skip
    return pd.DataFrame(rows, columns=[*LABELS, "threads", *METRICS]).set_index("key")


def compare(a: str | Path, b: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, summary) of the cells done in both stores, as the module docstring says."""
    first, second = done_cells(a), done_cells(b)
    both = first.merge(second, left_index=True, right_index=True, suffixes=("_a", "_b"))
    cells = both[[f"{c}_a" for c in LABELS[1:]]].set_axis(LABELS[1:], axis=1)
    cells = cells.assign(threads_a=both.threads_a, threads_b=both.threads_b)
    summary = []
    for m in METRICS:
        diff = both[f"{m}_b"] - both[f"{m}_a"]
        cells = cells.assign(**{f"{m}_a": both[f"{m}_a"], f"{m}_b": both[f"{m}_b"],
                                f"{m}_diff": diff})  # fmt: skip
        summary.append({
            "metric": m, "cells": int(diff.notna().sum()), "identical": int((diff == 0).sum()),
            "median_abs_diff": diff.abs().median(), "max_abs_diff": diff.abs().max(),
        })  # fmt: skip
    return cells.reset_index(), pd.DataFrame(summary)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ablations.bench.variance", description=__doc__)
    parser.add_argument("a", help="the first run's store (.sqlite)")
    parser.add_argument("b", help="the second run's store, the same grid")
    parser.add_argument("--out", required=True, help="folder for by_cell.csv and summary.csv")
    args = parser.parse_args(argv)
    cells, summary = compare(args.a, args.b)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells.to_csv(out / "by_cell.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
