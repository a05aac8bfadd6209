"""``attn-zoo reproduce REPORT_DIR``: a sample of a committed report's cells rerun at the code
checked out now, committed vs rerun per metric written beside the report
(ablations/run/reproduce.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ablations.arguments import Help, number
from ablations.cli.common import add_import, import_plugins


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``reproduce`` command and its options."""
    r = sub.add_parser(
        "reproduce", help="rerun a sample of a report's cells here and compare",
        formatter_class=Help,
        description="Rerun cells of a committed report (its cells.csv) with the code checked "
        "out now, each with the torch threads, precision, seed and device it recorded, and write "
        "committed vs rerun per metric to REPORT_DIR/reproduce.csv.",
    )  # fmt: skip
    r.add_argument("report", metavar="REPORT_DIR", help="a report's folder (its cells.csv)")
    r.add_argument("--sample", type=number(int, 1), default=4,
                   help="how many done cells to rerun, drawn at random")  # fmt: skip
    r.add_argument("--seed", type=int, default=0, help="the seed of that draw")
    r.add_argument(
        "--key", dest="keys", action="append", default=[], metavar="KEY",
        help="a cell to rerun, by its key (cells.csv's first column; repeatable; in place of "
        "--sample)",
    )  # fmt: skip
    r.add_argument(
        "--threads", type=number(int, 1), default=None,
        help="torch threads for every rerun (default: each cell's recorded count): a probe of "
        "run-to-run variance, its rows kept beside those of other thread counts",
    )  # fmt: skip
    add_import(r)
    r.set_defaults(func=reproduce)


def reproduce(args: argparse.Namespace) -> int:
    folder = Path(args.report)
    if not (folder / "cells.csv").is_file():
        raise SystemExit(f"error: REPORT_DIR {folder}: no cells.csv there (a report's folder)")
    import_plugins(args)
    from ablations.run.reproduce import FILE, reproduce, summary  # loads torch (seconds)

    def on_cell(i: int, n: int, cell: str) -> None:
        print(f"[{i + 1}/{n}] {cell}", file=sys.stderr, flush=True)

    try:
        frame = reproduce(
            folder, sample=args.sample, seed=args.seed, keys=args.keys, imports=args.imports,
            threads=args.threads, on_cell=on_cell,
        )  # fmt: skip
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    for line in summary(frame):
        print(line)
    print(f"wrote {folder / FILE}")
    return 0
