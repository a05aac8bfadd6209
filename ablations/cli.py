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
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ablations.arguments import COUNT, Help, number
from ablations.bench import DTYPES, SUITES
from ablations.results.tracking import BACKENDS, TrackingError, TrackingPlan

if TYPE_CHECKING:
    import pandas as pd


def _bench(args: argparse.Namespace) -> None:
    from ablations.bench.suites import BenchRun, run_bench

    _import_plugins(args)
    bench = BenchRun(**{f.name: getattr(args, f.name) for f in fields(BenchRun)})
    try:
        run_bench(bench)
    except (ValueError, OSError) as err:  # a bad setting, a folder that cannot be written
        raise SystemExit(f"error: {err}") from None


def _load_grid(args: argparse.Namespace, path: str, here: bool = True):
    """The grid at `path` with the --set overrides and --import plugins of `args` (SpecError ->
    exit with its line); `here=False` for commands that train nothing (status, report): a
    device this machine lacks is not refused."""
    from ablations.grid.spec import SpecError, load_grid

    try:
        return load_grid(path, args.set, check_device=here, imports=args.imports)
    except SpecError as err:
        raise SystemExit(f"error: {err}") from None


def _import_plugins(args: argparse.Namespace) -> None:
    """The --import plugins of a command without a grid (bench, a report of a store)."""
    from ablations.grid.plugins import import_plugins
    from attn_zoo.registry import PluginError

    try:
        import_plugins(args.imports, where="--import")
    except PluginError as err:
        raise SystemExit(f"error: {err}") from None


def _tracking(args: argparse.Namespace, plan: TrackingPlan | None) -> TrackingPlan | None:
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


def _cell_table(spec) -> pd.DataFrame:
    """One row per cell of `spec`: its labels, status in the store and main metrics."""
    from ablations.results.store import StoreError
    from ablations.run.status import grid_status

    try:  # read-only: status and dry runs never create or change a store
        frame = grid_status(spec)
    except StoreError as err:
        raise SystemExit(f"error: {err}") from None
    return frame.drop(columns=["key", "error"])


def _ablate_run(args: argparse.Namespace) -> int:
    from ablations.grid.spec import SpecError
    from ablations.results.store import StoreError
    from ablations.run.runner import RunStopped, check_cells, run_grid
    from ablations.run.search import run_search, trial_spec
    from ablations.run.status import status_text

    spec = _load_grid(args, args.grid)
    try:
        if args.dry_run:
            spec = trial_spec(spec)  # a search: the trials stored so far
            check_cells(spec)
            table = _cell_table(spec)
            print(status_text(table, spec.swept_keys))
            print(f"\n{len(table)} cells; store {spec.store}; by status:")
            print(table["status"].value_counts().to_string())
            return 0
        run = run_search if spec.search is not None else run_grid
        counts = run(
            spec, executor=args.executor, workers=args.workers, address=args.address,
            retry_failed=args.retry_failed, interval=args.interval,
            tracking=_tracking(args, spec.tracking),
        )  # fmt: skip
    except (SpecError, StoreError, TrackingError) as err:
        raise SystemExit(f"error: {err}") from None
    except RunStopped:  # its one line is printed
        return 1
    return 1 if counts["failed"] else 0


def _ablate_status(args: argparse.Namespace) -> int:
    from ablations.run.search import trial_spec
    from ablations.run.status import status_text

    spec = trial_spec(_load_grid(args, args.grid, here=False))

    table = _cell_table(spec)
    print(status_text(table, spec.swept_keys))
    counts = table["status"].value_counts()
    print(f"\ngrid {spec.name!r}, store {spec.store}: " + ", ".join(
        f"{n} {status}" for status, n in counts.items()
    ))  # fmt: skip
    return 0


def _ablate_best(args: argparse.Namespace) -> int:
    from ablations.run.search import best_text

    spec = _load_grid(args, args.grid, here=False)
    if spec.search is None:
        raise SystemExit(
            f"error: {spec.path} has no [search]: its report selects its best settings"
        )
    print(best_text(spec))
    return 0


def _report(args: argparse.Namespace) -> int:
    from ablations.results.cells_file import CellsFile
    from ablations.results.store import ResultsStore

    source, selection, keys, tracking = Path(args.source), None, None, None
    grid = Path(args.source) if source.suffix == ".toml" else args.grid
    if args.grid is not None and source.suffix != ".csv":
        raise SystemExit(
            f"error: --grid {args.grid} gives a cells.csv its grid; {source} is not a .csv"
        )
    if source.suffix == ".toml":  # the grid's cells only (a search: the trials stored)
        from ablations.run.search import trial_spec

        spec = trial_spec(_load_grid(args, args.source, here=False))
        store, name, selection, tracking = spec.store, spec.name, spec.selection, spec.tracking
        keys = {cell.key: cell.config() for cell in spec.cells}  # those not run: listed
    elif source.suffix == ".csv":  # a report's cells: its grid's [selection] from --grid
        if grid is None:
            _import_plugins(args)
        else:
            selection = _load_grid(args, grid, here=False).selection
        store, name = _cells_source(args, source), source.parent.name
    else:
        _import_plugins(args)
        store, name = source, source.stem
    tracking = _tracking(args, tracking)
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
                overrides=args.set if grid is not None else (),
            )  # fmt: skip
        print(f"wrote {out}/report.md, {out}/index.html and the CSVs and plots beside them")
        for warning in log_report(tracking, name, store.path, out):
            print(warning)
    except (OSError, ValueError) as err:  # a folder that is not a report, a store unreadable
        raise SystemExit(f"error: {err}") from None
    return 0


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


def _version() -> str:
    """The installed attn_zoo's version (attn_zoo.__version__, read without importing torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attn_zoo")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        import attn_zoo

        return attn_zoo.__version__


def _add_import(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="a module or .py file to import first: your own mechanisms, backends, tasks "
        "(repeatable; every worker imports it too)",
    )  # fmt: skip


def _add_tracking_uri(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--tracking-uri", default=None, metavar="URI",
        help="where the trackers write: a folder, or MLflow's sqlite:///FILE.db or "
        "file:///FOLDER (in place of the grid's [tracking] uri; without either: tracking/ "
        "beside the store)",
    )  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="attn-zoo", description="attn_zoo: benchmarks and ablation grids", formatter_class=Help
    )
    p.add_argument("--version", action="version", version=f"attn-zoo {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "bench", help="time and peak memory of every backend over N", formatter_class=Help,
        description="Time (median of interleaved repeats) and peak memory of the backends.",
    )  # fmt: skip
    b.add_argument(
        "--suite", nargs="+", choices=[*SUITES, "generation", "window"], default=list(SUITES),
        help=f"which suites to run (default: {' '.join(SUITES)}); generation (tokens per second, "
        "cached vs uncached) runs on its own; window: a sliding window as a mask mod against "
        "the same window as a dense mask",
    )  # fmt: skip
    b.add_argument("--lengths", type=COUNT, nargs="+", default=None,
                   help="sequence lengths N (without: each suite's own list)")  # fmt: skip
    b.add_argument("--repeats", type=COUNT, default=5, help="timed repeats per workload")
    b.add_argument("--no-causal", action="store_true", help="time non-causal attention only")
    b.add_argument(
        "--also-non-causal", action="store_true",
        help="measure each suite causal, then non-causal (tables <suite>, <suite>_noncausal)",
    )  # fmt: skip
    b.add_argument("--device", default="cpu", help="torch device to run on")
    b.add_argument("--no-memory", action="store_true", help="skip the peak memory measurement")
    b.add_argument("--csv-dir", default=None, help="also write bench_<suite>.csv files here")
    b.add_argument(
        "--report", default=None, metavar="DIR",
        help="also write a report here: report.md, index.html, CSVs and plots",
    )  # fmt: skip
    k = b.add_argument_group("softmax suite")
    k.add_argument("--backends", nargs="+", default=None,
                   help="softmax backends to time (without: all usable here)")  # fmt: skip
    k.add_argument("--batch", type=COUNT, default=1, help="batch size B")
    k.add_argument("--heads", type=COUNT, default=8, help="attention heads H")
    k.add_argument("--head-dim", type=COUNT, default=64, help="head width d")
    k.add_argument("--dtype", choices=DTYPES, default="float32", help="input dtype")
    k.add_argument("--window", type=COUNT, default=64, help="window suite: keys in the window")
    r = b.add_argument_group("relational and dual suites")
    r.add_argument("--d-model", type=COUNT, default=512, help="layer width d_model")
    r.add_argument(
        "--ra-heads", type=COUNT, default=4, help="relational heads (dual: and as many standard)"
    )
    r.add_argument(
        "--ra-backends", nargs="+", default=None,
        help="our backends to time (without: auto and all); reference and standard_sdpa always",
    )  # fmt: skip
    _add_import(b)
    b.set_defaults(func=_bench)

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
        _add_import(q)
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
    _add_tracking_uri(run)
    run.set_defaults(func=_ablate_run)
    status.set_defaults(func=_ablate_status)
    best.set_defaults(func=_ablate_best)

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
        help="with a cells.csv: the grid file whose [selection] the report uses (without: "
        "no selection section); its SHA-256 goes into the report",
    )  # fmt: skip
    r.add_argument("--out", default=None,
                   help="folder to write (without: reports/<grid name>)")  # fmt: skip
    r.add_argument(
        "--target", type=number(float, 0, 1), default=None,
        help="metric value for the steps-to-target columns (without: none)",
    )  # fmt: skip
    r.add_argument("--title", default=None, help="page title (without: from the grid name)")
    r.add_argument("--note", default=None, help="a paragraph under the header, e.g. a conclusion")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides of the grid spec given as source or as --grid "
                   "(repeatable)")  # fmt: skip
    r.add_argument(
        "--track", action="append", default=[], choices=["mlflow"], metavar="BACKEND",
        help="also log the report's files as artifacts of an MLflow run named 'report' in "
        "the grid's experiment (a grid whose [tracking] names mlflow does so without it)",
    )  # fmt: skip
    _add_tracking_uri(r)
    _add_import(r)
    r.set_defaults(func=_report)
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


if __name__ == "__main__":
    sys.exit(main())
