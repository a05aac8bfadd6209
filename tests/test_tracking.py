"""Experiment tracking (ablations.results.tracking): a tracked run read back with each library's own
reader equals the store's tables; bad backends and places refused in one line before anything
runs; a tracker that fails costs a warning line, never the stored result."""

import io
import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from grids import REL, STD, tiny_grid

from ablations.cli import main
from ablations.grid.spec import SpecError, load_grid
from ablations.results import tracking
from ablations.results.frames import FRAME_COLUMNS, is_missing
from ablations.results.store import ResultsStore
from ablations.results.tracking import TrackingError, TrackingPlan
from ablations.run.progress import cell_label
from ablations.run.runner import run_grid

ROOT = Path(__file__).resolve().parents[1]
CURVES = ("train_loss", "val_loss", "val_metric")


def store_tables(spec) -> tuple[dict, dict]:
    """Per cell key, its row of the store's cells table and its rows of the curves table."""
    store = ResultsStore(spec.store, readonly=True)
    frame = store.to_dataframe().set_index("key")
    curves = {key: rows for key, rows in store.curves().groupby("key")}
    return {key: frame.loc[key] for key in frame.index}, curves


def config_of(row) -> dict:
    """The flat config of a cells-table row: its config columns the cell has."""
    skip = set(FRAME_COLUMNS)
    return {
        k: v for k, v in row.items()
        if k not in skip and not k.startswith("metrics.") and not is_missing(v)
    }  # fmt: skip


def metrics_of(row) -> dict:
    return {k: v for k, v in row.items() if k.startswith("metrics.") and not is_missing(v)}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A 2-cell grid run from the command line with TensorBoard and MLflow on, in a folder
    given relative to the working folder."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    tmp = tmp_path_factory.mktemp("tracked")
    path = tiny_grid(tmp, seeds=[0], mechanisms=[STD, REL])
    here = Path.cwd()
    os.chdir(tmp)
    try:
        argv = ["ablate", "run", str(path), "--workers", "1", "--track", "tensorboard"]
        assert main([*argv, "--track", "mlflow", "--tracking-uri", "runs"]) == 0
    finally:
        os.chdir(here)
    return load_grid(path), tmp / "runs"


def test_tensorboard_holds_each_cells_curve_and_config(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    spec, folder = tracked
    rows, curves = store_tables(spec)
    assert sorted(p.name for p in (folder / "tensorboard" / spec.name).iterdir()) == sorted(rows)
    for key, row in rows.items():
        events = EventAccumulator(str(folder / "tensorboard" / spec.name / key), {"scalars": 0})
        events.Reload()
        points = curves[key]
        for name in CURVES:  # float32 in event files
            got = [(e.step, e.value) for e in events.Scalars(name)]
            want = list(zip(points.step, points[name], strict=True))
            assert [s for s, _ in got] == [s for s, _ in want]
            assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
        for name, value in metrics_of(row).items():
            (event,) = events.Scalars(name)
            assert event.step == points.step.iloc[-1] and event.value == pytest.approx(value)
        start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
        given = {k: v.string_value or v.number_value for k, v in hparams.items()}
        want = {
            k: v if isinstance(v, str) else pytest.approx(float(v))
            for k, v in config_of(row).items()
        }  # fmt: skip
        assert given == {**want, "status": "done"}


def test_mlflow_holds_a_run_per_cell_with_its_config_curve_and_metrics(tracked):
    from mlflow.tracking import MlflowClient

    spec, folder = tracked
    rows, curves = store_tables(spec)
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(spec.name).experiment_id
    runs = {run.data.tags["key"]: run for run in client.search_runs([experiment])}
    assert sorted(runs) == sorted(rows)  # one run per cell
    labels = {cell.key: cell_label(cell) for cell in spec.cells}
    for key, run in runs.items():
        row = rows[key]
        assert run.info.run_name == labels[key] and run.info.status == "FINISHED"
        assert run.data.tags["status"] == row.status == "done"
        assert run.data.params == {k: str(v) for k, v in config_of(row).items()}
        for name in CURVES:
            history = client.get_metric_history(run.info.run_id, name)
            got = sorted((m.step, m.value) for m in history)
            assert got == list(zip(curves[key].step, curves[key][name], strict=True))
        final = {k: v for k, v in run.data.metrics.items() if k.startswith("metrics.")}
        assert final == pytest.approx(metrics_of(row))


def test_the_report_logs_its_files_to_an_mlflow_run(tracked, tmp_path):
    from mlflow.tracking import MlflowClient

    spec, folder = tracked
    out = tmp_path / "report"
    argv = ["report", str(spec.path), "--out", str(out), "--track", "mlflow"]
    assert main([*argv, "--tracking-uri", str(folder)]) == 0
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(spec.name).experiment_id
    (run,) = client.search_runs([experiment], "attributes.run_name = 'report'")
    logged = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert logged == {p.name for p in out.iterdir()} and "report.md" in logged


def test_bad_backends_and_places_are_refused_in_one_line(tmp_path, capsys):
    path = tiny_grid(tmp_path, seeds=[0], mechanisms=[STD])
    text = path.read_text()
    for table, fragment in (
        ('backends = ["tensorbored"]', "tracking.backends[0] = 'tensorbored'"),
        ("backends = []", "tracking.backends = []"),
        ('backends = ["mlflow"]\nuri = "http://server:5000"', "tracking.uri = 'http://server"),
    ):
        path.write_text(f"{text}[tracking]\n{table}\n")
        with pytest.raises(SpecError) as err:
            load_grid(path)
        assert fragment in str(err.value) and "\n" not in str(err.value)
    path.write_text(text)
    with pytest.raises(SystemExit) as err:
        main(["ablate", "run", str(path), "--track", "tensorbored"])
    assert err.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--track: invalid choice: 'tensorbored'" in line and "mlflow" in line
    for argv, fragment in (
        (["--track", "mlflow", "--tracking-uri", "http://server"], "--tracking-uri: tracking"),
        (["--tracking-uri", "runs"], "but none is on"),
    ):
        with pytest.raises(SystemExit) as err:
            main(["ablate", "run", str(path), *argv])
        assert str(err.value).startswith("error: ") and fragment in str(err.value)
        assert "\n" not in str(err.value)
    assert not (tmp_path / "tiny.sqlite").exists()  # nothing ran


def test_mlflow_is_never_pointed_at_another_file_or_at_the_results_store(tmp_path):
    """A folder name with # would cut MLflow's sqlite URI short (the database landed in another
    file); the results store itself is no MLflow database."""
    plan = TrackingPlan(("mlflow",))
    with pytest.raises(TrackingError, match="holds # \\? or %"):
        plan.at("trk#1", tmp_path).where(tmp_path / "grid.sqlite")
    store = tmp_path / "grid.sqlite"
    with pytest.raises(TrackingError, match="is the results store itself"):
        plan.at(f"sqlite:///{store}", tmp_path).where(store)
    assert plan.at("runs", tmp_path).where(store)[1] == f"sqlite:///{tmp_path}/runs/mlflow.db"


def test_a_missing_package_is_named_before_any_cell_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(tracking.BACKENDS, "mlflow", ("no_such_package", "pip install it"))
    spec = load_grid(tiny_grid(tmp_path, seeds=[0], mechanisms=[STD]))
    with pytest.raises(TrackingError, match="'mlflow' needs the no_such_package package, which "
                       "is not installed: pip install it"):  # fmt: skip
        run_grid(spec, workers=1, tracking=TrackingPlan(("mlflow",)))
    assert not spec.store.exists()
    with pytest.raises(SystemExit, match="^error: tracking backend 'mlflow' needs"):
        main(["ablate", "run", str(spec.path), "--track", "mlflow"])


def test_a_tracker_that_cannot_start_stops_the_run_before_any_cell(tmp_path, monkeypatch):
    def refused(self, uri, folder, grid):
        raise RuntimeError(f"no store at {uri}\nmore")

    pytest.importorskip("mlflow")
    monkeypatch.setattr(tracking.MLflow, "__init__", refused)
    spec = load_grid(tiny_grid(tmp_path, seeds=[0], mechanisms=[STD]))
    uri = f"sqlite:///{tmp_path / 'tracking' / 'mlflow.db'}"
    with pytest.raises(SystemExit) as err:
        main(["ablate", "run", str(spec.path), "--track", "mlflow"])
    assert str(err.value) == (
        f"error: tracking backend 'mlflow' cannot start in {uri}: RuntimeError: no store at {uri}"
    )
    assert not list(ResultsStore(spec.store, readonly=True).rows())


def test_a_failing_tracker_is_a_warning_line_and_the_result_is_stored(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")

    def broken(self, run):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(tracking.TensorBoard, "log", broken)
    monkeypatch.chdir(tmp_path.parent)  # the grid's uri is relative to its own folder
    path = tiny_grid(tmp_path, seeds=[0, 1], mechanisms=[STD])
    path.write_text(path.read_text() + '[tracking]\nbackends = ["tensorboard"]\nuri = "tb"\n')
    spec = load_grid(path)
    out = io.StringIO()
    assert run_grid(spec, workers=1, out=out) == {"done": 2, "failed": 0, "diverged": 0}
    rows = list(ResultsStore(spec.store, readonly=True).rows())
    assert sorted(r["key"] for r in rows) == sorted(c.key for c in spec.cells)
    assert {r["status"] for r in rows} == {"done"} and all(r["curve"] for r in rows)
    warnings = [line for line in out.getvalue().splitlines() if line.startswith("warning:")]
    assert sorted(warnings) == sorted(
        f"warning: tensorboard did not record cell {cell_label(cell)} (its result is stored): "
        "RuntimeError: disk on fire"
        for cell in spec.cells
    )
    assert (tmp_path / "tb").is_dir()


class Loud:
    """A tracker whose library logs the error it catches, with its traceback, then (`fails`)
    raises its own error caused by it, as MLflow does."""

    name, loggers = "loud", ("loudlib",)

    def __init__(self, fails: bool):
        self.fails = fails

    def log(self, run) -> None:
        try:
            raise OSError("the disk is gone")
        except OSError as err:
            logging.getLogger("loudlib.store").exception("database error caught")
            if self.fails:
                raise RuntimeError("could not log\n(long SQL)") from err


def test_what_a_failing_trackers_library_logs_is_dropped_and_kept_when_it_succeeds(caplog):
    record = {"status": "done", "metrics": {}, "curve": [], "error": None}
    warnings = tracking.Trackers([Loud(fails=True)]).log("c", {"seed": 0}, record)
    assert warnings == [
        "warning: loud did not record cell c (its result is stored): OSError: the disk is gone"
    ]
    assert caplog.records == []  # nothing reached the root logger (pytest's handler)
    assert tracking.Trackers([Loud(fails=False)]).log("c", {"seed": 0}, record) == []
    (kept,) = caplog.records  # passed on after the tracker succeeded, traceback and all
    assert kept.name == "loudlib.store" and kept.exc_info[0] is OSError
    assert logging.getLogger("loudlib").handlers == [] and logging.getLogger("loudlib").propagate


# The CLI with MLflow's folder (the last argument) deleted before the second cell is logged
BREAKING = """
import shutil, sys
from ablations.results import tracking
from ablations.cli import main

real_log = tracking.MLflow.log

def log_after_deleting_the_folder(self, run):
    if run.name.endswith("seed1"):
        shutil.rmtree(sys.argv[-1])
    real_log(self, run)

tracking.MLflow.log = log_after_deleting_the_folder
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # a process importing MLflow: 10 s
def test_a_tracker_failing_mid_run_is_one_line_without_the_librarys_traceback(tmp_path):
    """MLflow's folder deleted between two cells (its database goes read-only): MLflow logs
    the error with SQLAlchemy's traceback, which the run holds back; the user sees one line
    naming the tracker, the cell and the innermost cause, and the grid finishes."""
    pytest.importorskip("mlflow")
    folder = tmp_path / "runs"
    spec = load_grid(tiny_grid(tmp_path, seeds=[0, 1], mechanisms=[STD]))
    argv = ["ablate", "run", str(spec.path), "--workers", "1", "--track", "mlflow"]
    run = subprocess.run(
        [sys.executable, "-c", BREAKING, *argv, "--tracking-uri", str(folder)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "Traceback" not in said and "ERROR" not in said, said
    (warning,) = [line for line in said.splitlines() if line.startswith("warning:")]
    assert warning == (
        f"warning: mlflow did not record cell {cell_label(spec.cells[1])} (its result is "
        "stored): OperationalError: attempt to write a readonly database"
    )
    rows = list(ResultsStore(spec.store, readonly=True).rows())
    assert [r["status"] for r in rows] == ["done", "done"]


def test_tracking_places(tmp_path):
    plan = TrackingPlan(("mlflow",))
    store = tmp_path / "results" / "g.sqlite"
    assert plan.where(store) == (
        tmp_path / "results" / "tracking",
        f"sqlite:///{tmp_path / 'results' / 'tracking' / 'mlflow.db'}",
    )
    assert plan.at("runs", tmp_path).where(store) == (
        tmp_path / "runs",
        f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}",
    )
    assert plan.at("sqlite:///db/m.db", tmp_path).where(store) == (
        tmp_path / "db",
        f"sqlite:///{tmp_path / 'db' / 'm.db'}",
    )
    assert plan.at(f"sqlite:///{tmp_path}/m.db", Path("/elsewhere")).where(store)[0] == tmp_path
    assert plan.at(f"file://{tmp_path}/mlruns", Path("/elsewhere")).where(store) == (
        tmp_path,
        (tmp_path / "mlruns").as_uri(),
    )
    for bad in ("", "http://host/x", "postgresql://db", "sqlite:///", "file:relative"):
        with pytest.raises(TrackingError, match="valid is a folder"):
            plan.at(bad, tmp_path)


def wandb_records(path: Path) -> list:
    """The records of a W&B offline run file (wandb's protobuf Record; the file: a 7-byte
    header, then 32 KiB blocks of chunks, each a crc32 (4 bytes), its length (2) and its kind:
    1 whole, 2 first, 3 middle, 4 last)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, block = path.read_bytes(), 32768
    pos, records, part = 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's zero padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(Record.FromString(part))
            part = b""
    return records


def item_key(item) -> str:
    """The key of an item of a W&B record (one of two fields hold it)."""
    return item.key or "/".join(item.nested_key)


@pytest.mark.slow  # W&B starts a service per run
def test_wandb_offline_runs_hold_each_cells_config_curve_and_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    spec = load_grid(tiny_grid(tmp_path, seeds=[0], mechanisms=[STD, REL]))
    plan = TrackingPlan(("wandb",)).at("runs", tmp_path)
    out = io.StringIO()
    assert run_grid(spec, workers=1, out=out, tracking=plan)["done"] == 2
    assert "warning" not in out.getvalue()
    rows, curves = store_tables(spec)
    found = {}
    for path in (tmp_path / "runs" / "wandb").glob("offline-run-*/run-*.wandb"):
        records = wandb_records(path)
        (run,) = [r.run for r in records if r.HasField("run")]
        summary = {item_key(i): json.loads(i.value_json) for r in records if r.HasField("summary")
                   for i in r.summary.update}  # fmt: skip
        history = [{item_key(i): json.loads(i.value_json) for i in r.history.item}
                   for r in records if r.HasField("history")]  # fmt: skip
        config = {item_key(i): json.loads(i.value_json) for i in run.config.update}
        config.pop("_wandb")
        found[summary["key"]] = (run, summary, history, config)
    assert sorted(found) == sorted(rows)  # one run per cell
    for key, (run, summary, history, config) in found.items():
        row = rows[key]
        assert list(run.tags) == ["done"] and summary["status"] == "done"
        assert config == pytest.approx(config_of(row))
        assert {k: summary[k] for k in metrics_of(row)} == pytest.approx(metrics_of(row))
        points = [point for point in history if "val_loss" in point]  # not W&B's own rows
        got = [[point["_step"], *(point[name] for name in CURVES)] for point in points]
        assert got == curves[key][["step", *CURVES]].to_numpy().tolist()


def test_a_pruned_trials_mlflow_run_is_killed_not_failed(tmp_path):
    pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = tracking.MLflow(uri, tmp_path, "grid")
    curve = [(5, {"train_loss": 1.0, "val_loss": 1.1, "val_metric": 0.5})]
    tracker.log(tracking.CellRun("cell", "k" * 16, "pruned", None, {"seed": 0}, curve, {}))
    (run,) = tracker.client.search_runs([tracker.experiment])
    assert run.info.status == "KILLED"  # a search's pruned trial was stopped, it did not fail
