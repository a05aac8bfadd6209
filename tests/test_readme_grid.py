"""The README's grid example is a valid grid that can train, and the shipped grids load."""

import re
from pathlib import Path

import pytest

from ablations.runner import check_cells
from ablations.spec import load_grid

ROOT = Path(__file__).resolve().parent.parent


def test_readme_grid_example_loads_and_every_cell_can_train(tmp_path):
    (block,) = re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    path = tmp_path / "readme.toml"
    path.write_text(block)
    spec = load_grid(path)
    assert len(spec.cells()) == 3 - 1  # 3 seeds, one excluded
    check_cells(spec)


@pytest.mark.parametrize("grid", sorted((ROOT / "ablations" / "grids").glob("*.toml")))
def test_shipped_grids_load(grid):
    assert load_grid(grid).cells()
