"""``attn-zoo report SOURCE``: a grid's report (report.md, index.html, CSVs, plots) from its
store, from a results store, or rebuilt from a report's own cells.csv (ablations/report/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ablations.arguments import Help, number
from ablations.cli.common import (
    add_import,
    add_tracking_uri,
    import_plugins,
    load_grid,
    tracking_plan,
)
from ablations.results.tracking import TrackingPlan


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``report`` command and its options."""
    r = sub.add_parser(
        "report", help="tables, plots, markdown and HTML of a grid's results", formatter_class=Help,
        description="Write a grid's report (report.md, index.html, CSVs, plots) into a folder "
        "that belongs to the report: it is replaced whole.",
    )  # fmt: skip
    r.add_argument(
        "source",
        help="a grid spec (.toml: its cells, its [selection]), a results store (.sqlite: "
        "every cell in it) or a report's cells.csv (its cells, and the curves.csv beside it: "
        "the report rebuilt from the files it wrote)",
    )  # fmt: skip
    r.add_argument(
        "--grid", default=None, metavar="GRID",
        help="with a cells.csv: the grid file whose [selection] and [report] the report uses "
        "(without: those its provenance.json records, if any); its SHA-256 goes into the report",
    )  # fmt: skip
    r.add_argument("--out", default=None,
                   help="folder to write (without: reports/<grid name>)")  # fmt: skip
    r.add_argument(
        "--target", type=number(float, 0, 1), default=None,
        help="metric value for the steps-to-target columns (without: none)",
    )  # fmt: skip
    r.add_argument("--title", default=None, help="page title (without: from the grid name)")
    r.add_argument("--note", default=None, help="a paragraph under the header, e.g. a conclusion")
    r.add_argument(
        "--require-clean", action="store_true",
        help="refuse (naming the cells) unless every finished cell ran from one commit with "
        "no uncommitted change to the code, and the cells of each task read one version of "
        "each data file",
    )  # fmt: skip
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides of the grid spec given as source or as --grid "
                   "(repeatable)")  # fmt: skip
    r.add_argument(
        "--track", action="append", default=[], choices=["mlflow"], metavar="BACKEND",
        help="also log the report's files as artifacts of an MLflow run named 'report' in "
        "the grid's experiment (a grid whose [tracking] names mlflow does so without it)",
    )  # fmt: skip
    add_tracking_uri(r)
    add_import(r)
    r.set_defaults(func=report)


def report(args: argparse.Namespace) -> int:
    from ablations.results.cells_file import CellsFile
    from ablations.results.store import ResultsStore

    source, selection, keys, tracking, lead = Path(args.source), None, None, None, None
    grid = Path(args.source) if source.suffix == ".toml" else args.grid
    if args.grid is not None and source.suffix != ".csv":
        raise SystemExit(
            f"error: --grid {args.grid} gives a cells.csv its grid; {source} is not a .csv"
        )
    if source.suffix == ".toml":  # the grid's cells only (a search: the trials stored)
        from ablations.run.search import trial_spec

        spec = trial_spec(load_grid(args, args.source, here=False))
        store, name, selection, tracking = spec.store, spec.name, spec.selection, spec.tracking
        lead = spec.file.report
        keys = {cell.key: cell.config() for cell in spec.cells}  # those not run: listed
    elif source.suffix == ".csv":  # a report's cells: its grid's [selection] from --grid
        if grid is None:
            import_plugins(args)
        else:
            spec = load_grid(args, grid, here=False)
            selection, lead = spec.selection, spec.file.report
        store, name = _cells_source(args, source), source.parent.name
        if grid is not None:
            keys = _planned(spec, store, grid)
    else:
        import_plugins(args)
        store, name = source, source.stem
    tracking = tracking_plan(args, tracking)
    mlflow = tracking is not None and "mlflow" in tracking.backends  # a report goes there only
    out = Path(args.out or Path("reports") / name)
    try:  # read-only, as status reads it: no store, or a file that is not one, refused at once
        if isinstance(store, Path) and not store.is_file():
            raise FileNotFoundError(f"no results store at {store}")
        store = store if isinstance(store, CellsFile) else ResultsStore(store, readonly=True)
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    from ablations.report.build import write_report  # after the checks: it loads torch (seconds)
    from ablations.results.tracking import check_backends, log_report
    from ablations.steps import make_steps

    try:
        if mlflow:  # a missing package: refused before the report is written
            check_backends(TrackingPlan(("mlflow",)))
        with make_steps("report", "steps") as progress:  # a bar on stderr, on a terminal
            write_report(
                store, out, title=args.title, target=args.target, note=args.note,
                selection=selection, keys=keys, progress=progress, grid=grid,
                overrides=args.set if grid is not None else (), require_clean=args.require_clean,
                report=lead,
            )  # fmt: skip
        print(f"wrote {out}/report.md, {out}/index.html and the CSVs and plots beside them")
        for warning in log_report(tracking, name, store.path, out):
            print(warning)
    except (OSError, ValueError) as err:  # a folder that is not a report, a store unreadable
        raise SystemExit(f"error: {err}") from None
    return 0


def _planned(spec, cells, grid: Path) -> dict | None:
    """The cells of `grid` (`spec`) by key, so that those the cells.csv `cells` lacks are
    listed and counted as not run, as a report of the grid lists them; None where a cell of
    the cells.csv is none of the grid's (a grid changed since: a note says no cell is listed
    as not run)."""
    from ablations.run.search import trial_spec

    planned = {cell.key: cell.config() for cell in trial_spec(spec).cells}
    others = {row["key"] for row in cells.rows()} - planned.keys()
    if not others:
        return planned
    print(f"note: {len(others)} cells of the cells.csv are not cells of {grid} as it is now "
          "(changed since?): the report lists none of its cells as not run")  # fmt: skip
    return None


def _cells_source(args: argparse.Namespace, source: Path):
    """The report's cells.csv `source` read whole (ablations.results.cells_file), its --grid loaded
    already; refused: no --out (the folder is replaced whole: name it), trackers (a rebuild
    is no run of the grid), --set without --grid. A note where --grid's SHA-256 differs from
    the one the provenance.json beside `source` records."""
    import json

    from ablations.results.cells_file import CellsFile
    from ablations.run.provenance import file_sha256

    if args.out is None:
        raise SystemExit(f"error: a report from {source} needs --out DIR (replaced whole)")
    if args.track or args.tracking_uri is not None:
        raise SystemExit("error: --track: a report rebuilt from a cells.csv is logged nowhere")
    if args.set and args.grid is None:
        raise SystemExit("error: --set overrides the grid of --grid, and none is given")
    try:
        cells = CellsFile(source)
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    provenance = source.with_name("provenance.json")
    if args.grid is not None and provenance.is_file():
        try:
            recorded = json.loads(provenance.read_text(encoding="utf-8"))["grid_sha256"]
        except (ValueError, TypeError, KeyError) as err:
            raise SystemExit(f"error: {provenance} is not a report's provenance: {err!r}") from None
        digest = file_sha256(args.grid)
        if recorded not in (None, digest):
            print(f"note: {args.grid} has changed since the report of {source} was built "
                  f"from it (SHA-256 now {digest[:12]}..., then {recorded[:12]}...)")  # fmt: skip
    return cells
