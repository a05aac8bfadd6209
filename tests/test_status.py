"""One status function for run, status and dry run: every cell of the grid with its state."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ablations.grid.spec import load_grid
from ablations.results.store import ResultsStore
from ablations.run.runner import cells_to_train
from ablations.run.status import COLUMNS, grid_status
from tests.test_spec import GRID

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    return load_grid(path)


def test_a_grid_without_a_store_is_all_todo_and_no_store_is_created(spec):
    frame = grid_status(spec)
    assert list(frame.columns) == COLUMNS
    assert len(frame) == len(spec.cells) and set(frame.status) == {"todo"}
    assert list(frame.key) == [cell.key for cell in spec.cells]
    assert not spec.store.exists()


def test_statuses_and_metrics_come_from_the_store(spec):
    cells = spec.cells
    store = ResultsStore(spec.store)
    done, failed, running = (store.claim(c.config()) for c in cells[:3])
    store.finish(done, "done", {"steps": 20, "test_acc": 0.75})
    store.finish(failed, "failed", error="Traceback ...\nValueError: boom")
    frame = grid_status(spec).set_index("key")
    assert frame.loc[done, "status"] == "done" and frame.loc[done, "test_acc"] == 0.75
    assert frame.loc[done, "steps"] == 20
    assert frame.loc[failed, "error"] == "ValueError: boom"
    assert frame.loc[running, "status"] == "running"
    assert set(frame.drop([done, failed, running]).status) == {"todo"}
    row = frame.loc[done]
    assert (row.task, row["size"], row.mechanism, row.seed) == tuple(cells[0].labels.values())


def test_a_claim_whose_run_died_shows_as_stale_and_the_next_run_trains_it(spec):
    """A real process claims a cell and dies without giving it back (as a run does when a
    full disk leaves no room to release its claim): status says stale, not running, and the
    cell is among those a run trains."""
    (cell,) = spec.cells[:1]
    claim = (
        "import os, sys; from ablations.results.store import ResultsStore; "
        f"ResultsStore({str(spec.store)!r}).claim({cell.config()!r}); os._exit(0)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", claim], check=True, env=env, timeout=60)
    assert ResultsStore(spec.store, readonly=True).status(cell.config()) == "running"
    frame = grid_status(spec).set_index("key")
    assert frame.loc[cell.key, "status"] == "stale"
    assert cell in cells_to_train(spec)


def test_a_corrupt_store_is_one_error_naming_it(spec):
    spec.store.parent.mkdir(parents=True, exist_ok=True)
    spec.store.write_text("not a database")
    with pytest.raises(ValueError, match=f"{spec.store}.*not a readable results store"):
        grid_status(spec)
