"""The driver-overhead measurement (ablations/bench/engine_overhead.py) writes what it prints, and
refuses a report folder it cannot write before measuring anything."""

import pandas as pd
import pytest

from ablations.bench import engine_overhead

RUNS = [
    {"executor": "local", "cells": 500, "slots": 2, "total_s": 5.25, "startup_s": 0.31,
     "first_cell_s": 1.5, "cells_per_s": 149.125, "train_ms": 9.5, "overhead_ms": 3.875,
     "driver_cpu_ms": 1.125},
]  # fmt: skip
STORES = [{"cells": 500, "claim_ms": 0.0875, "finish_ms": 0.0625, "read_ms": 0.0125}]


def test_the_report_holds_every_measured_number(tmp_path):
    run_cell = {"cells": 20, "median_ms": 14.25}
    engine_overhead.write_report(tmp_path, "python -m ablations.bench.engine_overhead", RUNS,
                                 run_cell, STORES, 2)  # fmt: skip
    for name, rows in (("runs.csv", RUNS), ("store.csv", STORES), ("run_cell.csv", [run_cell])):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / name), pd.DataFrame(rows))
    page = (tmp_path / "report.md").read_text()
    assert engine_overhead.markdown(RUNS, engine_overhead.RUN_COLUMNS).splitlines()[2] in page
    assert "| 500 | 0.09 | 0.06 | 0.01 |" in page
    assert "14.2 ms per cell (median of 20)" in page
    assert "- Machine: " in page and "- Command: python -m ablations.bench.engine_overhead" in page
    assert (tmp_path / "index.html").stat().st_size > 0


def test_an_unwritable_report_folder_is_refused_before_measuring(tmp_path, monkeypatch, capsys):
    def measured(*args, **kwargs):
        raise AssertionError("measured before checking --report")

    monkeypatch.setattr(engine_overhead, "measure_run", measured)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_:
        engine_overhead.main(["--cells", "2", "--report", str(blocker / "report")])
    assert exit_.value.code == 2
    assert f"--report {blocker / 'report'}: cannot write files there" in capsys.readouterr().err


def test_a_folder_that_is_not_an_earlier_report_of_it_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(engine_overhead, "measure_run", None)  # never reached
    (tmp_path / "report.md").write_text("a grid's report")
    with pytest.raises(SystemExit) as exit_:
        engine_overhead.main(["--cells", "2", "--report", str(tmp_path)])
    assert exit_.value.code == 2 and "not an earlier report" in capsys.readouterr().err
    assert (tmp_path / "report.md").read_text() == "a grid's report"


def test_a_report_without_run_cell_leaves_no_earlier_run_cell_csv(tmp_path):
    (tmp_path / "run_cell.csv").write_text("cells,median_ms\n20,14.25\n")
    engine_overhead.write_report(tmp_path, "python -m ablations.bench.engine_overhead", RUNS, None,
                                 STORES, 2)  # fmt: skip
    assert not (tmp_path / "run_cell.csv").exists() and (tmp_path / "runs.csv").is_file()
