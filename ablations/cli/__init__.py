"""The ``attn-zoo`` command.

attn-zoo bench [--suite softmax relational dual mechanisms] [--lengths ...] [--also-non-causal]
               [--ra-backends ...] [--csv-dir DIR] [--report DIR]
attn-zoo ablate run GRID [--executor local|ray] [--address ADDR] [--workers N] [--set k=v]
                         [--dry-run] [--retry-failed] [--track tensorboard|mlflow|wandb]
                         [--tracking-uri URI]
attn-zoo ablate status GRID [--set k=v]
attn-zoo ablate best GRID [--set k=v]
attn-zoo report GRID_OR_STORE [--out DIR] [--target T] [--note TEXT] [--track mlflow]
                              [--tracking-uri URI]
attn-zoo report CELLS_CSV --out DIR [--grid GRID [--set k=v]] [--target T] [--note TEXT]
attn-zoo reproduce REPORT_DIR [--sample N] [--seed S] [--key KEY ...]
"""

from __future__ import annotations

import argparse
import sys

from ablations.arguments import Help
from ablations.cli import ablate, bench, report, reproduce


def _version() -> str:
    """The installed attn_zoo's version (attn_zoo.__version__, read without importing torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attn_zoo")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        import attn_zoo

        return attn_zoo.__version__


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="attn-zoo", description="attn_zoo: benchmarks and ablation grids", formatter_class=Help
    )
    p.add_argument("--version", action="version", version=f"attn-zoo {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in (bench, ablate, report, reproduce):  # each module builds its own command
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except SystemExit:  # GridInterrupted too: its summary is printed, its code 130 or 143
        raise
    except KeyboardInterrupt:  # before a run installs its own handlers, or in a report
        print("interrupted", file=sys.stderr)
        return 130
