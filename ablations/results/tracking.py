"""Experiment tracking: each finished cell of a run copied to TensorBoard, MLflow or W&B.

The results store stays the record: the driver (ablations.run.runner) stores a cell's outcome
first, then hands it to each tracker; a tracker that fails costs one warning line (the tracker,
the cell, and its error's innermost cause in one line), never the stored result, and the grid
goes on. What the tracker's libraries log meanwhile (`loggers`: MLflow's and SQLAlchemy's
tracebacks of the very error) is held back, and shown only when the tracker succeeds.
Switched on per grid, per run or per call:

    [tracking]                              # in the grid file
    backends = ["tensorboard", "mlflow"]    # any of BACKENDS
    uri = "tracking"                        # optional: where (below)

    attn-zoo ablate run GRID --track tensorboard --track mlflow --tracking-uri DIR
    run_grid(spec, tracking=TrackingPlan(("mlflow",)).at("sqlite:///runs.db", Path.cwd()))

`uri`: a folder (relative to the grid file's folder; on the command line, to the working
folder), or MLflow's own store, "sqlite:///FILE.db" or "file:///FOLDER" (MLflow's file store,
which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true), with the other backends' files in
that store's folder. Without one: the folder "tracking" beside the results store. No server.

One run per cell, when its outcome is stored (done, diverged or failed; a cell lost or taken
over by another run is not tracked), named after its label ("task/size/mechanism/seed0"):

- params: its config, flat (`ResultsStore.to_dataframe()`'s names: "training.lr", ...)
- step metrics: train_loss, val_loss and val_metric at its curve's steps (`CURVE_FIELDS`)
- final metrics: "metrics.<name>" ("metrics.test_acc", ...), at its last evaluated step
- its status (and a failed cell's error, the traceback's last line) and key: tags in MLflow
  and W&B, hparams ("status") and text in TensorBoard

Where: TensorBoard event files (scalars and hparams) in <folder>/tensorboard/<grid>/<cell key>
(a cell trained again adds its events there); MLflow's experiment <grid> in <folder>/mlflow.db
(SQLite; artifacts in <folder>/mlartifacts/<grid>) or the store `uri` names; W&B offline runs
(`wandb sync` uploads them) of project <grid> in <folder>/wandb. `attn-zoo report` logs a
report's files (markdown, HTML, CSVs, figures) as artifacts of an MLflow run named "report"
(`log_report`). The packages: `pip install 'attn_zoo[tracking]'` (tensorboard, mlflow-skinny,
and sqlalchemy and alembic for MLflow's SQLite store), and wandb for W&B; a missing one is a
TrackingError before any cell runs.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path

# backend -> (the module it needs, what to install)
BACKENDS = {
    "tensorboard": ("tensorboard", "pip install 'attn_zoo[tracking]' (or tensorboard)"),
    "mlflow": ("mlflow", "pip install 'attn_zoo[tracking]' (or mlflow-skinny)"),
    "wandb": ("wandb", "pip install wandb"),
}
URI_FORMS = (
    'a folder, or MLflow\'s store: "sqlite:///FILE.db" or "file:///FOLDER" (no server), e.g. '
    '"tracking" or "sqlite:///tracking/mlflow.db"'
)
METRICS_PER_BATCH, PARAMS_PER_BATCH = 1000, 100  # what one MLflow log_batch call takes


class TrackingError(ValueError):
    """Tracking cannot start: an unknown backend, a package not installed, a bad uri, a store
    MLflow refuses. Raised before any cell runs; its message is one line."""


def is_tracking_uri(uri: str) -> bool:
    """Whether `uri` is one of `URI_FORMS`: an SQLite or file URI with a path, or a path (no
    other scheme: "http://..." would need a server)."""
    if re.fullmatch(r"(sqlite|file):///.+", uri):
        return True
    return uri != "" and not re.match(r"[A-Za-z][A-Za-z0-9+.-]+:", uri)


@dataclass(frozen=True)
class TrackingPlan:
    """What a run tracks (`backends`, names of `BACKENDS`) and where: `folder` holds
    TensorBoard's event files, W&B's runs and MLflow's database (None: "tracking" beside the
    results store), unless `mlflow_uri` names MLflow's store."""

    backends: tuple[str, ...] = ()
    folder: Path | None = None
    mlflow_uri: str | None = None

    def at(self, uri: str | None, base: Path) -> TrackingPlan:
        """This plan writing where `uri` says (`URI_FORMS`; a relative path from the folder
        `base`); unchanged for None. TrackingError for another form."""
        if uri is None:
            return self
        if not is_tracking_uri(uri):
            raise TrackingError(f"tracking uri {uri!r}: valid is {URI_FORMS}")
        mlflow = re.fullmatch(r"(sqlite|file):///(.+)", uri)
        if mlflow is None:  # a folder
            return replace(self, folder=Path(base, uri).resolve(), mlflow_uri=None)
        scheme, path = mlflow.groups()  # sqlite:///relative.db, sqlite:////absolute.db
        place = Path(base, "/" + path if scheme == "file" else path).resolve()
        store = f"sqlite:///{place}" if scheme == "sqlite" else place.as_uri()
        return replace(self, folder=place.parent, mlflow_uri=store)

    def where(self, store: Path) -> tuple[Path, str]:
        """The folder and MLflow store URI of a run on the results store `store`."""
        folder = self.folder or Path(store).resolve().parent / "tracking"
        uri = self.mlflow_uri or f"sqlite:///{folder / 'mlflow.db'}"
        database = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
        if database is not None and set(database) & set("#?%"):  # a URL would cut the path
            raise TrackingError(
                f"MLflow's database path {database!r} holds # ? or %, which its sqlite URI "
                "cannot carry: choose a tracking folder without them"
            )
        if database is not None and Path(database).resolve() == Path(store).resolve():
            raise TrackingError(
                f"MLflow's database {database} is the results store itself: give MLflow a "
                "database of its own (--tracking-uri DIR or sqlite:///OTHER.db)"
            )
        return folder, uri


def check_backends(plan: TrackingPlan | None) -> None:
    """TrackingError naming the first backend of `plan` that is unknown or whose package is not
    installed, and what to install."""
    for name in plan.backends if plan is not None else ():
        if name not in BACKENDS:
            raise TrackingError(
                f"tracking backend {name!r} is unknown: valid are {', '.join(BACKENDS)}"
            )
        module, install = BACKENDS[name]
        if importlib.util.find_spec(module) is None:
            raise TrackingError(
                f"tracking backend {name!r} needs the {module} package, which is not "
                f"installed: {install}"
            )


@dataclass(frozen=True)
class CellRun:
    """What a tracker records of one finished cell (see the module's docstring)."""

    name: str  # the cell's label
    key: str
    status: str  # done, diverged, failed, pruned
    error: str | None  # a failed cell's: the traceback's last line
    params: dict  # its config, flat
    curve: list[tuple[int, dict[str, float]]]  # (step, {"train_loss": ..., "val_loss": ...})
    metrics: dict  # "metrics.<name>": float

    @property
    def last_step(self) -> int:
        return self.curve[-1][0] if self.curve else 0


def cell_run(name: str, config: dict, record: dict) -> CellRun:
    """The `CellRun` of a cell of label `name` and `config` from the `record` its outcome was
    stored with (the keyword arguments of `ResultsStore.finish`)."""
    # here, not above: `attn-zoo --help` reads BACKENDS without loading pandas
    from ablations.results.frames import flat_config
    from ablations.results.store import CURVE_FIELDS, config_key, error_summary

    metrics = {f"metrics.{k}": float(v) for k, v in (record["metrics"] or {}).items()}
    curve = [
        (step, dict(zip(CURVE_FIELDS[1:], values, strict=True)))
        for step, *values in record["curve"] or []
    ]
    error = error_summary(record["error"]) if record["status"] == "failed" else None
    status = record["status"]
    return CellRun(name, config_key(config), status, error, flat_config(config), curve, metrics)


class TensorBoard:
    """Event files per cell, written with torch.utils.tensorboard's SummaryWriter."""

    name = "tensorboard"
    loggers = ("tensorboard",)  # the library loggers `Trackers.log` holds back

    def __init__(self, folder: Path, grid: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer, self.root = SummaryWriter, folder / "tensorboard" / grid

    def log(self, run: CellRun) -> None:
        from torch.utils.tensorboard.summary import hparams

        with self.writer(log_dir=str(self.root / run.key)) as writer:
            for step, values in run.curve:
                for name, value in values.items():
                    writer.add_scalar(name, value, step)
            for name, value in run.metrics.items():
                writer.add_scalar(name, value, run.last_step)
            given = {**run.params, "status": run.status}  # hparams take numbers and texts
            values = {k: v if type(v) in (int, float, str) else str(v) for k, v in given.items()}
            for summary in hparams(values, run.metrics):
                writer.file_writer.add_summary(summary)
            error = f": {run.error}" if run.error else ""
            writer.add_text("cell", f"{run.name}: {run.status}{error}")


class MLflow:
    """A run per cell in the grid's experiment, through MlflowClient (no global state)."""

    name = "mlflow"
    loggers = ("mlflow", "sqlalchemy", "alembic")

    def __init__(self, uri: str, folder: Path, grid: str):
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(grid)
        if found is None:
            try:
                self.experiment = self.client.create_experiment(
                    grid, artifact_location=(folder / "mlartifacts" / grid).as_uri()
                )
                return
            except MlflowException:  # another run created it meanwhile
                found = self.client.get_experiment_by_name(grid)
                if found is None:
                    raise
        if found.lifecycle_stage != "active":
            raise TrackingError(
                f"MLflow experiment {grid!r} in {uri} is deleted: restore it (mlflow "
                "experiments restore) or delete it for good (mlflow gc) to track this grid"
            )
        self.experiment = found.experiment_id

    def start(self, name: str, tags: dict[str, str]) -> str:
        """A new run `name` with `tags` in the experiment: its id."""
        return self.client.create_run(self.experiment, run_name=name, tags=tags).info.run_id

    def log(self, run: CellRun) -> None:
        from mlflow.entities import Metric, Param

        tags = {"status": run.status, "key": run.key} | ({"error": run.error} if run.error else {})
        run_id = self.start(run.name, tags)
        now = int(time.time() * 1000)
        metrics = [
            Metric(name, value, now, step)
            for step, values in run.curve
            for name, value in values.items()
        ]
        metrics += [Metric(name, value, now, run.last_step) for name, value in run.metrics.items()]
        params = [Param(name, str(value)) for name, value in run.params.items()]
        try:
            for start in range(0, len(params), PARAMS_PER_BATCH):
                self.client.log_batch(run_id, params=params[start : start + PARAMS_PER_BATCH])
            for start in range(0, len(metrics), METRICS_PER_BATCH):
                self.client.log_batch(run_id, metrics=metrics[start : start + METRICS_PER_BATCH])
        except BaseException:
            with suppress(Exception):  # a store that failed may fail this too: the first error
                self.client.set_terminated(run_id, "FAILED")
            raise
        ended = {"done": "FINISHED", "pruned": "KILLED"}  # pruned: stopped by the search
        self.client.set_terminated(run_id, ended.get(run.status, "FAILED"))

    def log_files(self, name: str, folder: Path) -> None:
        """A run `name` holding the files of `folder` as its artifacts."""
        run_id = self.start(name, {"kind": name})
        try:
            self.client.log_artifacts(run_id, str(folder))
        except BaseException:
            self.client.set_terminated(run_id, "FAILED")
            raise
        self.client.set_terminated(run_id, "FINISHED")


class Wandb:
    """An offline W&B run per cell (`wandb sync <folder>/wandb/offline-run-*` uploads them)."""

    name = "wandb"
    loggers = ("wandb",)

    def __init__(self, folder: Path, grid: str):
        import wandb

        self.wandb, self.folder, self.project = wandb, folder, grid

    def log(self, run: CellRun) -> None:
        live = self.wandb.init(
            project=self.project, name=run.name, config=run.params, dir=str(self.folder),
            tags=[run.status], mode="offline", settings=self.wandb.Settings(silent=True),
        )  # fmt: skip
        try:
            for step, values in run.curve:
                live.log(values, step=step)
            extra = {"error": run.error} if run.error else {}
            live.summary.update({**run.metrics, "status": run.status, "key": run.key, **extra})
        finally:
            live.finish(exit_code=0 if run.status == "done" else 1)


class Trackers:
    """The trackers of one run: `log` copies a stored cell to each of them."""

    def __init__(self, trackers: list):
        self.trackers = trackers

    def log(self, name: str, config: dict, record: dict) -> list[str]:
        """Copy the cell of label `name` and `config`, stored with `record` (`cell_run`), to
        every tracker; a warning line for each that failed (`_one_line`), what its libraries
        logged about the failure dropped (`_held`)."""
        if not self.trackers:
            return []
        what = f"cell {name} (its result is stored)"
        try:
            run = cell_run(name, config, record)
        except Exception as err:
            return [f"warning: tracking did not record {what}: {_one_line(err)}"]
        warnings = []
        for tracker in self.trackers:
            try:
                with _held(tracker.loggers):
                    tracker.log(run)
            except Exception as err:
                warnings.append(f"warning: {tracker.name} did not record {what}: {_one_line(err)}")
        return warnings


def _one_line(err: BaseException) -> str:
    """'TypeName: the first line of its message' of the innermost cause of `err` (raise ...
    from ...): of MLflow's MlflowException from SQLAlchemy's OperationalError from sqlite3's,
    sqlite3's "OperationalError: attempt to write a readonly database"."""
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


class _Hold(logging.Handler):
    """A logging handler that keeps the records it is given (`records`)."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _held(names: tuple[str, ...]) -> Iterator[None]:
    """Hold what the loggers `names` (and those below them) log during the block: passed on
    to their own handlers after it, or dropped when it raises (its error is then one line of
    ours, not the library's traceback)."""
    loggers = [logging.getLogger(name) for name in names]
    saved = [(logger.handlers, logger.propagate) for logger in loggers]
    hold = _Hold()
    for logger in loggers:
        logger.handlers, logger.propagate = [hold], False
    try:
        yield
    finally:
        for logger, (handlers, propagate) in zip(loggers, saved, strict=True):
            logger.handlers, logger.propagate = handlers, propagate
    for record in hold.records:  # the block succeeded
        logging.getLogger(record.name).handle(record)


def open_trackers(plan: TrackingPlan | None, grid: str, store: Path) -> Trackers:
    """The trackers of `plan` for grid `grid` on the results store `store`, opened (folders
    made, MLflow's experiment found or created); none without a plan. TrackingError, one line,
    when one cannot be: a missing package (`check_backends`), a store MLflow refuses."""
    check_backends(plan)
    if plan is None or not plan.backends:
        return Trackers([])
    folder, uri = plan.where(store)
    opened = []
    for name in dict.fromkeys(plan.backends):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if name == "tensorboard":
                opened.append(TensorBoard(folder, grid))
            elif name == "mlflow":
                opened.append(MLflow(uri, folder, grid))
            else:
                opened.append(Wandb(folder, grid))
        except TrackingError:
            raise
        except Exception as err:
            where = uri if name == "mlflow" else folder
            raise TrackingError(
                f"tracking backend {name!r} cannot start in {where}: {_one_line(err)}"
            ) from err
    return Trackers(opened)


def log_report(plan: TrackingPlan | None, grid: str, store: Path, report: Path) -> list[str]:
    """Log the files of the report folder `report` as the artifacts of an MLflow run named
    "report" in the experiment of `grid`, when `plan` tracks to MLflow (the other backends
    take no files); a warning line if that failed (the report is written either way). A
    missing package, a store MLflow refuses: TrackingError."""
    if plan is None or "mlflow" not in plan.backends:
        return []
    (mlflow,) = open_trackers(replace(plan, backends=("mlflow",)), grid, store).trackers
    try:
        mlflow.log_files("report", report)
    except Exception as err:
        return [f"warning: mlflow did not record the report (it is written): {_one_line(err)}"]
    return []
