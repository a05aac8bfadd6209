"""One status function for run, status and dry run: every cell of the grid with its state."""

import pytest

from ablations.spec import load_grid
from ablations.status import COLUMNS, grid_status
from ablations.store import ResultsStore
from tests.test_spec import GRID


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


def test_a_corrupt_store_is_one_error_naming_it(spec):
    spec.store.parent.mkdir(parents=True, exist_ok=True)
    spec.store.write_text("not a database")
    with pytest.raises(ValueError, match=f"{spec.store}.*not a readable results store"):
        grid_status(spec)
