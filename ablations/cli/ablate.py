"""``attn-zoo ablate run|status|best GRID``: train a grid's unfinished cells (resumable), show
every cell's status, or print a search's best trials as --set lines."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ablations.arguments import COUNT, Help, number
from ablations.cli.common import add_import, add_tracking_uri, load_grid, tracking_plan
from ablations.results.tracking import BACKENDS, TrackingError

if TYPE_CHECKING:
    import pandas as pd


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``ablate`` command and its actions run, status and best."""
    a = sub.add_parser("ablate", help="run grids of mechanism x size x task x seed",
                       formatter_class=Help)  # fmt: skip
    asub = a.add_subparsers(dest="action", required=True)
    run = asub.add_parser(
        "run", help="train every unfinished cell of a grid (resumable)", formatter_class=Help,
        description="Train every cell of the grid that is not finished. Runs on one store may "
        "overlap: each cell is claimed by one run. Ctrl-C or SIGTERM stops within seconds and "
        "gives the cells in flight back; run again to resume.",
    )  # fmt: skip
    status = asub.add_parser(
        "status", help="the status and metrics of every cell of a grid", formatter_class=Help,
        description="Every cell's status and metrics; reads the store without writing it.",
    )  # fmt: skip
    best = asub.add_parser(
        "best", help="each group's best trial of a grid's [search], as --set lines",
        formatter_class=Help,
        description="Each (task, size, mechanism) group's best trial of the grid's [search] "
        "on its metric, then --set lines putting each mechanism at it, for a second-stage grid "
        "(the grid without [search], on every seed). Reads the store without writing it.",
    )  # fmt: skip
    for q in (run, status, best):
        q.add_argument("grid", help="a grid spec (TOML), e.g. ablations/grids/demo.toml")
        q.add_argument(
            "--set", action="append", default=[], metavar="KEY=VALUE",
            help="override a spec value, e.g. --set training.steps=50 (repeatable)",
        )  # fmt: skip
        add_import(q)
    run.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="local processes on this machine, or a Ray cluster")  # fmt: skip
    run.add_argument("--address", default=None,
                     help="Ray cluster address (without: a local Ray instance)")  # fmt: skip
    run.add_argument("--workers", type=COUNT, default=None,
                     help="cells trained at once (without: one per usable core; with a [search]: "
                     "one, each trial chosen knowing every trial before it)")  # fmt: skip
    run.add_argument("--dry-run", action="store_true",
                     help="list the cells and their status, train nothing")  # fmt: skip
    run.add_argument("--retry-failed", action="store_true",
                     help="train failed cells again (done and diverged ones never)")  # fmt: skip
    run.add_argument(
        "--interval", type=number(float, 0, low_open=True), default=10.0,
        help="seconds between status lines when not on a terminal",
    )  # fmt: skip
    run.add_argument(
        "--track", action="append", default=[], choices=list(BACKENDS), metavar="BACKEND",
        help=f"also log each finished cell to this tracker ({', '.join(BACKENDS)}; repeatable; "
        "in place of the grid's [tracking] backends)",
    )  # fmt: skip
    add_tracking_uri(run)
    run.set_defaults(func=run_grid)
    status.set_defaults(func=show_status)
    best.set_defaults(func=show_best)


def _cell_table(spec) -> pd.DataFrame:
    """One row per cell of `spec`: its labels, status in the store and main metrics."""
    from ablations.results.store import StoreError
    from ablations.run.status import grid_status

    try:  # read-only: status and dry runs never create or change a store
        frame = grid_status(spec)
    except StoreError as err:
        raise SystemExit(f"error: {err}") from None
    return frame.drop(columns=["key", "error"])


def run_grid(args: argparse.Namespace) -> int:
    from ablations.grid.spec import SpecError
    from ablations.results.store import StoreError
    from ablations.run.runner import RunStopped, check_cells
    from ablations.run.runner import run_grid as run_cells
    from ablations.run.search import run_search, trial_spec
    from ablations.run.status import status_text

    spec = load_grid(args, args.grid)
    try:
        if args.dry_run:
            spec = trial_spec(spec)  # a search: the trials stored so far
            check_cells(spec)
            table = _cell_table(spec)
            print(status_text(table, spec.axes().swept))
            print(f"\n{len(table)} cells; store {spec.store}; by status:")
            print(table["status"].value_counts().to_string())
            return 0
        run = run_search if spec.search is not None else run_cells
        counts = run(
            spec, executor=args.executor, workers=args.workers, address=args.address,
            retry_failed=args.retry_failed, interval=args.interval,
            tracking=tracking_plan(args, spec.tracking),
        )  # fmt: skip
    except (SpecError, StoreError, TrackingError) as err:
        raise SystemExit(f"error: {err}") from None
    except RunStopped:  # its one line is printed
        return 1
    return 1 if counts["failed"] else 0


def show_status(args: argparse.Namespace) -> int:
    from ablations.run.search import trial_spec
    from ablations.run.status import plugin_code, status_text

    spec = trial_spec(load_grid(args, args.grid, here=False))

    table = _cell_table(spec)
    print(status_text(table, spec.axes().swept))
    counts = table["status"].value_counts()
    print(f"\ngrid {spec.name!r}, store {spec.store}: " + ", ".join(
        f"{n} {status}" for status, n in counts.items()
    ))  # fmt: skip
    for line in plugin_code(spec):  # what the store's cells ran with besides the library
        print(line)
    return 0


def show_best(args: argparse.Namespace) -> int:
    from ablations.run.search import best_text

    spec = load_grid(args, args.grid, here=False)
    if spec.search is None:
        raise SystemExit(
            f"error: {spec.path} has no [search]: its report selects its best settings"
        )
    print(best_text(spec))
    return 0
