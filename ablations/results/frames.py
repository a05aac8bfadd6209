"""A store's cells as one pandas table: one row per cell, its config flattened to the columns a
grid file names (`flat_config`), its metrics as ``metrics.*`` (`cells_table`, what
`ResultsStore.to_dataframe()` gives and a report reads), whole numbers kept whole beside a gap."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import pandas as pd

FRAME_COLUMNS = ("key", "status", "error", "started", "finished")  # then config, metrics.*


def is_missing(value: object) -> bool:
    """Whether a value of a frame is missing: None, NaN or pandas' NA."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def flat_config(config: Mapping) -> dict:
    """A cell's config as one flat dict, keyed as a grid file names its keys: nested tables
    flattened with dots ("training.lr", "task_kwargs.n_train", "mechanism_kwargs.n_heads",
    "mechanism_kwargs.symbol_retrieval_kwargs.max_length"), the size table as `size` (its label)
    and `model.<key>` (d_model, n_layers and the model options, as `[sweep] model.dff` names
    them); an empty table gives no key.

        flat_config({"seed": 0, "training": {"lr": 1e-3}, "size": {"label": "s", "dff": 64}})
        # {"seed": 0, "training.lr": 0.001, "size": "s", "model.dff": 64}
    """
    flat = {}
    for name, value in config.items():
        if name == "size" and isinstance(value, Mapping):
            if "label" in value:
                flat["size"] = value["label"]
            value = {k: v for k, v in value.items() if k != "label"}
            name = "model"
        if isinstance(value, Mapping):
            flat.update({f"{name}.{k}": v for k, v in flat_config(value).items()})
        else:
            flat[name] = value
    return flat


def cells_table(rows: Iterable[Mapping]) -> pd.DataFrame:
    """The table `ResultsStore.to_dataframe()` describes, of `rows` as `ResultsStore.rows()`
    gives them, or made up alike (a field a row leaves out: None; e.g. a grid's cells not run,
    with their configs); ValueError naming a cell whose config has a key that names another
    column."""
    records, config_keys = [], {}
    for row in rows:
        record = {k: row.get(k) for k in FRAME_COLUMNS}
        config = flat_config(row.get("config") or {})
        config_keys.update(dict.fromkeys(config))
        clash = [k for k in config if k in record or k.startswith("metrics.")]
        if clash:
            raise ValueError(
                f"cell {row['key']}'s config has the keys {', '.join(clash)}, which name "
                f"columns of the cells' table ({', '.join(FRAME_COLUMNS)}, metrics.*)"
            )
        record.update(config)
        record.update({f"metrics.{k}": v for k, v in (row.get("metrics") or {}).items()})
        records.append(record)
    if not records:
        return pd.DataFrame(columns=list(FRAME_COLUMNS))
    frame = pd.DataFrame(records)
    keep_whole_numbers(frame, {key: [record.get(key) for record in records] for key in config_keys})
    return frame


def keep_whole_numbers(frame: pd.DataFrame, values: Mapping[str, list]) -> None:
    """Give each column of `frame` that `values` names (its cells' values in row order, None
    where a cell has none) pandas' nullable "Int64" dtype where its values are ints with gaps,
    which pandas makes floats (4.0)."""
    for column, cells in values.items():
        whole = all(type(v) is int and -(2**63) <= v < 2**63 for v in cells if v is not None)
        if frame[column].dtype.kind == "f" and whole:  # beyond int64 they stay floats
            frame[column] = pd.array(cells, dtype="Int64")
