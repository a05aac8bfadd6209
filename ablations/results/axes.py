"""A grid's axes kept with its cells, and what a report reads its cells from.

`GridAxes`: the keys a grid sweeps, in grid order, and its [selection] table, as a run
recorded them (`ResultsStore.record_axes` at the start of `ablate run`; a report copies them
into its provenance.json, so that a report rebuilt from its cells.csv reads them back). A
report takes its axes from here, not from whichever columns happen to differ: a setting that
varies among the cells but no grid sweeps (cells of an earlier version of the grid, say) is
still kept apart, and named as such.

`CellSource` is the one protocol a report reads, implemented by a `ResultsStore` and a report's
`CellsFile` alike:

    source.path         where the cells are
    source.rows()       every cell: key, status, config, metrics, environment, curve, ...
    source.curves()     the learning curves (None: a cells.csv without its curves.csv)
    source.axes()       {grid name: GridAxes} as recorded ({} for a store or report older
                        than the record)
    source.draws_maps   whether the cells' attention-map files lie beside the source (a store);
    source.attention    else the maps a previous report drew, carried over (None: none)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pandas as pd


@dataclass(frozen=True)
class GridAxes:
    """The keys a grid sweeps (e.g. ("training.lr", "model.pos_enc")), in grid order, and its
    [selection] table as validated (every field; None for a grid without one)."""

    swept: tuple[str, ...]
    selection: dict | None = None

    def to_json(self) -> dict:
        return {"swept": list(self.swept), "selection": self.selection}

    @classmethod
    def from_json(cls, data: object, where: str) -> GridAxes:
        """The axes `to_json` wrote; ValueError naming `where` for anything else."""
        swept = data.get("swept") if isinstance(data, dict) else None
        selection = data.get("selection") if isinstance(data, dict) else None
        if (
            not isinstance(swept, list)
            or not all(isinstance(key, str) for key in swept)
            or not isinstance(selection, dict | None)
            or set(data) != {"swept", "selection"}
        ):
            raise ValueError(
                f"{where} holds the axes {data!r}; valid: "
                '{"swept": [swept key, ...], "selection": {...} or null}'
            )
        return cls(tuple(swept), selection)


def axes_from_json(data: object, where: str) -> dict[str, GridAxes]:
    """{grid name: GridAxes} from {name: GridAxes.to_json()}; ValueError naming `where`."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} holds the axes {data!r}; valid: {{grid name: axes}}")
    return {str(name): GridAxes.from_json(axes, f"{where} [{name}]") for name, axes in data.items()}


def swept_of(axes: dict[str, GridAxes], grids: Iterable[str]) -> list[str] | None:
    """The keys the grids `grids` sweep, each once, in grid order; None where one of them has
    no recorded axes (a store older than the record: the report then finds the axes as the
    settings that vary)."""
    swept: list[str] = []
    for grid in grids:
        if grid not in axes:
            return None
        swept += [key for key in axes[grid].swept if key not in swept]
    return swept


class CellSource(Protocol):
    """What a report reads its cells from (see the module)."""

    path: Path
    draws_maps: bool
    attention: tuple[list[list], dict[str, bytes]] | None

    def rows(self) -> Iterable[dict]: ...

    def curves(self) -> pd.DataFrame | None: ...

    def axes(self) -> dict[str, GridAxes]: ...
