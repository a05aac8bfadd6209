"""Loading a grid: a TOML (or Python) file naming tasks, model sizes, mechanisms, training
settings and seeds, `--set` overrides applied, validated whole before anything runs, and
expanded into cells once (`GridSpec.cells`, ablations/grid/cell.py): `load_grid` reads the file,
applies the --set overrides (overrides.py), checks it (validate.py), expands it (expand.py) or
plans its search (search_space.py).

The file's format: docs/grids.md (how it works) and docs/grid_reference.md (every key, generated
from the schema in ablations/grid/schema.py by ablations/grid/reference.py). Every value that
could not train is refused before anything is built or written, in a one-line `SpecError`
naming the file, the key, the bad value and the valid range or choices.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from ablations.grid.expand import cell_of, expand, swept_keys_of
from ablations.grid.overrides import apply_overrides, check_overrides_apply
from ablations.grid.search_space import SearchGroup, SearchPlan, check_search
from ablations.grid.validate import (
    IMPORTS,
    SpecError,
    check_builds,
    check_depth,
    check_entries,
    check_grid_rules,
    check_length,
    check_seeds,
    check_selection,
    check_sweep,
    check_training,
    one_line_error,
    spec_error,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ablations.grid.cell import (
    Cell,
    set_training,
    training_from,
)
from ablations.grid.devices import RESOURCE_DEFAULTS
from ablations.grid.plugins import import_plugins, resolve
from ablations.grid.schema import (
    RESUME_DEFAULTS,
    GridFile,
    Selection,
    TrainingSettings,
)
from ablations.results.axes import GridAxes
from ablations.results.store import ResultsStore
from ablations.results.tracking import TrackingPlan
from attn_zoo.registry import PluginError


@dataclass
class GridSpec:
    """A grid as `load_grid` returns it: its settings, and its cells, expanded once (the
    product of tasks x sizes x mechanisms x swept values x seeds, minus grid.exclude, plus
    grid.include), in grid order."""

    path: Path
    name: str
    seeds: list[int]
    store: Path  # the store's path joined to the grid file's folder
    file: GridFile  # the validated file (labels filled in)
    training: TrainingSettings  # [training] as the cells of a grid without overrides hold it
    cells: list[Cell]
    swept_keys: list[str]  # every swept key (any level, or named by an include), in order
    checkpoints: bool = False
    resources: dict = field(default_factory=lambda: dict(RESOURCE_DEFAULTS))  # no cell's part
    selection: Selection | None = None
    imports: list[str] = field(default_factory=list)  # plugins, as workers import them
    resume: dict = field(default_factory=lambda: dict(RESUME_DEFAULTS))  # no cell's part
    tracking: TrackingPlan | None = None  # [tracking], its uri resolved; no cell's part
    search: SearchPlan | None = None  # [search]: `cells` is empty, the trials are in the store

    def axes(self) -> GridAxes:
        """The grid's axes as a run records them with its cells (ablations/results/axes.py):
        its swept keys and [selection]."""
        selection = None if self.selection is None else self.selection.model_dump(mode="json")
        return GridAxes(tuple(self.swept_keys), selection)


def trial_cell(spec: GridSpec, group: SearchGroup, values: dict) -> Cell:
    """The cell of search `group` of `spec` with the searched keys at `values`."""
    return cell_of(spec.path, spec.name, group.base, {**group.values, **values}, group.seed)


def search_probe(plan: SearchPlan) -> dict:
    """The searched values a search's groups are checked at (built by `load_grid`,
    smoke-tested by ablations.run.search.run_search): each key's first choice, or its low end."""
    return {d.key: d.choices[0] if d.choices else d.low for d in plan.space}


def _plugins_hint(path: Path, raw: dict, imported: list[str], error: str) -> str:
    """For an error naming a name that is not registered: the plugins the grid's store records
    for its cells and this load did not import (" (its store's cells were run with plugins:
    try --import mine.py)"); "" otherwise, or where the store cannot be read."""
    if " is not valid. Valid: " not in error or not isinstance(raw.get("store"), str):
        return ""
    try:
        recorded = ResultsStore(path.parent / raw["store"], readonly=True).plugins()
    except (OSError, ValueError):  # no store, or not one: the error says enough
        return ""
    missing = [name for name in recorded if name not in imported]
    imports = " ".join(f"--import {name}" for name in missing)
    return f" (its store's cells were run with plugins: try {imports})" if missing else ""


def load_grid(
    path: str | Path,
    overrides: list[str] | None = None,
    check_device: bool = True,
    imports: list[str] | None = None,
) -> GridSpec:
    """Read, override, validate and return the grid at `path`; raises SpecError.
    `check_device=False` accepts a device this machine lacks (to read the status or report of
    a grid trained elsewhere, e.g. on a GPU). The plugins the grid's `imports` and `imports`
    here (the CLI's --import, resolved against the working folder) name are imported first
    (ablations.grid.plugins), so that their names are valid."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as err:
        raise SpecError(f"{path}: cannot read the grid spec: {one_line_error(err)}") from None
    check_depth(path, "the grid spec", raw)
    raw = apply_overrides(raw, overrides or [], path)
    try:  # plugins first: the rest of the file may name what they register
        named = IMPORTS.model_validate({"imports": raw.get("imports", [])}).imports
    except ValidationError as err:
        raise spec_error(path, err, root=IMPORTS) from None
    plugins = [*resolve(named, path.parent), *resolve(imports or [])]
    try:
        import_plugins(named, path.parent, f"{path.name} imports")
        import_plugins(imports or [], where="--import")
    except PluginError as err:
        raise SpecError(f"{path}: {err}") from None
    try:
        grid = GridFile.model_validate(raw)
    except ValidationError as err:
        error = spec_error(path, err)
        raise SpecError(f"{error}{_plugins_hint(path, raw, plugins, str(error))}") from None
    check_overrides_apply(grid, overrides or [], path)
    check_seeds(path, grid.seeds)
    for key in ("tasks", "sizes", "mechanisms"):
        check_entries(path, key, getattr(grid, key))
    check_length(path, "training", grid.training)
    check_sweep(path, "sweep", grid.sweep, [*grid.tasks, *grid.mechanisms])
    valid = {
        "task": [t.label for t in grid.tasks],
        "size": [s.label for s in grid.sizes],
        "mechanism": [m.label for m in grid.mechanisms],
        "seed": grid.seeds,
    }
    exclude, include = check_grid_rules(path, grid.grid, valid)
    given = {}
    for key, value in grid.training.model_dump(exclude_unset=True).items():
        set_training(given, key, value)
    swept_keys = swept_keys_of(grid, include)
    search = check_search(path, grid, swept_keys, exclude, include)
    if search is not None:
        swept_keys += [d.key for d in search.space]
    check_selection(path, grid.selection, swept_keys, grid.mechanisms)
    cells, unmatched = expand(path, grid, exclude, include)
    checked = cells
    if search is not None:  # no cells: the trials are chosen as the search runs
        checked = [cell_of(path, grid.name, g.base, {**g.values, **search_probe(search)}, g.seed)
                   for g in search.groups]  # fmt: skip
        cells = []
    elif not cells:
        raise SpecError(
            f"{path}: grid.exclude = {grid.grid.exclude!r} leaves no cell of the product of "
            f"tasks x sizes x mechanisms x swept values x seeds and grid.include adds none; a "
            f"grid needs at least one cell"
        )
    if unmatched:
        i = unmatched[0]
        raise SpecError(f"{path}: grid.exclude[{i}] = {exclude[i]!r} matches no cell of the grid")
    if check_device:
        check_training(path, checked)
    check_builds(path, checked)
    tracking = None
    if grid.tracking is not None:  # its uri resolved from the grid file's folder
        tracking = TrackingPlan(tuple(grid.tracking.backends)).at(grid.tracking.uri, path.parent)
    return GridSpec(
        path,
        grid.name,
        grid.seeds,
        Path(os.path.normpath(path.parent / (grid.store or f"results/{grid.name}.sqlite"))),
        grid,
        training_from(given),
        cells,
        swept_keys,
        grid.checkpoints,
        grid.resources.model_dump(),
        grid.selection,
        plugins,
        grid.resume.model_dump(),
        tracking,
        search,
    )
