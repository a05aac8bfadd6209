"""What the ``attn-zoo`` commands share: a grid loaded with the --set overrides and --import
plugins (errors as one line), the plugins of a command without a grid, the trackers a command
line asks for, and the options that several commands take."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from ablations.results.tracking import TrackingError, TrackingPlan


def load_grid(args: argparse.Namespace, path: str, here: bool = True):
    """The grid at `path` with the --set overrides and --import plugins of `args` (SpecError ->
    exit with its line); `here=False` for commands that train nothing (status, report): a
    device this machine lacks is not refused."""
    from ablations.grid.spec import SpecError
    from ablations.grid.spec import load_grid as load

    try:
        return load(path, args.set, check_device=here, imports=args.imports)
    except SpecError as err:
        raise SystemExit(f"error: {err}") from None


def import_plugins(args: argparse.Namespace) -> None:
    """The --import plugins of a command without a grid (bench, a report of a store)."""
    from ablations.grid.plugins import import_plugins as load
    from attn_zoo.registry import PluginError

    try:
        load(args.imports, where="--import")
    except PluginError as err:
        raise SystemExit(f"error: {err}") from None


def tracking_plan(args: argparse.Namespace, plan: TrackingPlan | None) -> TrackingPlan | None:
    """`plan` (a grid's [tracking], or None) with the --track backends and the --tracking-uri
    (relative to the working folder) of `args` in place of its own, where given."""
    if args.track:
        plan = replace(plan or TrackingPlan(), backends=tuple(args.track))
    if args.tracking_uri is not None:
        if plan is None:
            raise SystemExit(
                "error: --tracking-uri says where trackers write, but none is on: name one "
                "with --track (or in the grid's [tracking])"
            )
        try:
            plan = plan.at(args.tracking_uri, Path.cwd())
        except TrackingError as err:
            raise SystemExit(f"error: --tracking-uri: {err}") from None
    return plan


def add_import(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="a module or .py file to import first: your own mechanisms, backends, tasks "
        "(repeatable; every worker imports it too)",
    )  # fmt: skip


def add_tracking_uri(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--tracking-uri", default=None, metavar="URI",
        help="where the trackers write: a folder, or MLflow's sqlite:///FILE.db or "
        "file:///FOLDER (in place of the grid's [tracking] uri; without either: tracking/ "
        "beside the store)",
    )  # fmt: skip
