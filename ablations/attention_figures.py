"""Attention maps of trained cells, drawn from the maps recorded when each cell finished: every
attention module's weights (and relation tensors) per head, on one fixed test example.

    figure = cell_attention_figure(store, row)       # a row of ResultsStore.rows(), status done
    blocks = attention_blocks(store, folder)         # the report's "Attention maps" section
    model, task = load_cell_model(store, row)        # the trained weights, for your own use

In a grid that keeps checkpoints (``checkpoints = true`` in its spec), the worker that trained a
cell records the attention maps of its trained model on one test example of its seed
(`ablations.train.MAPS_EXAMPLE`; see `ablations.train.attention_record`) and the driver writes
them to `ResultsStore.maps_path`, beside the checkpoint; drawing them here runs no model. A
mechanism without attention weights (linear, additive) has an empty record. A maps file that is
missing or cannot be loaded (truncated, corrupt, not a maps record) skips that map with a
one-line note in the section, naming the cell and why; it never fails the report.
"""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.figure import Figure

from ablations.cell import Cell
from ablations.cell_model import build_cell_model
from ablations.report_pages import label_file_name, path_in, plot_text
from ablations.steps import Steps
from ablations.store import ResultsStore, error_summary
from ablations.tasks import build_task
from attn_zoo.maps import plot_attention_maps

NOTE_LENGTH = 200  # at most this many characters of an error in a skipped map's note


class CheckpointError(RuntimeError):
    """A cell's checkpoint file exists but cannot be loaded into the cell's model."""


class MapsError(RuntimeError):
    """A cell's maps file exists but cannot be loaded, or is not a record of attention maps;
    `reason` says why in one short line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def load_cell_model(store: ResultsStore, row: dict) -> tuple[torch.nn.Module, object]:
    """The trained model of a stored cell and its task; FileNotFoundError without checkpoint,
    CheckpointError when it cannot be loaded (truncated, corrupt, another model's)."""
    path = store.checkpoint_path(row["key"])
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint for cell {row['key']} at {path}: run the grid with checkpoints = true"
        )
    cell = Cell(**row["config"])
    task = build_task(cell.task_name, **cell.task_kwargs)
    model = build_cell_model(cell, task)
    try:
        model.load_state_dict(torch.load(path, weights_only=True))
    except Exception as err:  # torch raises OSError, RuntimeError, EOFError, pickle errors...
        raise CheckpointError(
            f"checkpoint of cell {row['key']} at {path} cannot be loaded: {_one_line(err)}"
        ) from err
    return model, task


def load_cell_maps(store: ResultsStore, row: dict) -> dict:
    """The attention maps recorded when the stored cell finished (see
    `ablations.train.attention_record`: example, labels, target, maps); FileNotFoundError
    without a maps file, MapsError when it cannot be loaded or is not such a record."""
    path = store.maps_path(row["key"])
    if not path.is_file():
        raise FileNotFoundError(
            f"no attention maps for cell {row['key']} at {path}: they are recorded when a cell "
            "of a grid with checkpoints = true finishes"
        )
    try:
        record = torch.load(path, weights_only=True)
    except Exception as err:  # torch raises OSError, RuntimeError, EOFError, pickle errors...
        reason = _one_line(err)
        message = f"maps file of cell {row['key']} at {path} cannot be loaded: {reason}"
        raise MapsError(message, reason) from err
    problem = _record_problem(record)
    if problem:
        reason = f"not a maps record: {problem}"
        raise MapsError(f"maps file of cell {row['key']} at {path} is {reason}", reason)
    return record


def _record_problem(record: object) -> str | None:
    """What is wrong with a loaded maps record, or None."""
    if not isinstance(record, dict) or not {"example", "labels", "target", "maps"} <= set(record):
        return "not a dict with example, labels, target and maps"
    maps = record["maps"]
    if not isinstance(maps, dict) or not all(isinstance(kinds, dict) for kinds in maps.values()):
        return "maps is not a dict of module name -> kind -> tensor"
    for name, kinds in maps.items():
        for kind, tensor in kinds.items():
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4 or not tensor.shape[0]:
                return f"maps[{name!r}][{kind!r}] is not a (1, heads, N, M) tensor"
    if not isinstance(record.get("error", ""), str):
        return "error is not a str"
    labels = record["labels"]
    if labels is not None and not (
        isinstance(labels, list) and all(isinstance(label, str) for label in labels)
    ):
        return "labels is neither None nor a list of str"
    return None


def _one_line(err: BaseException) -> str:
    """'Type: first line of the message', at most NOTE_LENGTH characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= NOTE_LENGTH else text[: NOTE_LENGTH - 3] + "..."


def _figure(record: dict, row: dict) -> Figure:
    config = row["config"]
    title = (
        f"{config['task']} / {config['mechanism']} / seed {config['seed']}: test example "
        f"{record['example']}, label {record['target']}"
    )
    return plot_attention_maps(record["maps"], labels=record["labels"], title=plot_text(title))


def cell_attention_figure(store: ResultsStore, row: dict) -> Figure:
    """Heatmaps of the stored cell's attention on the test example its maps were recorded on
    (`ablations.train.MAPS_EXAMPLE` of its seed); errors as `load_cell_maps` (MapsError too
    when recording them failed), and ValueError for a mechanism without attention maps."""
    record = load_cell_maps(store, row)
    if record.get("error"):
        raise MapsError(
            f"cell {row['key']} has no attention maps: recording them failed when it finished: "
            f"{error_summary(record['error'])}",
            "recording failed",
        )
    if not record["maps"]:
        raise ValueError(
            f"cell {row['key']} has no attention maps: mechanism "
            f"{row['config']['mechanism_name']!r} has no attention weights"
        )
    return _figure(record, row)


def _rank(row: dict, prefer: set[str] | None) -> tuple[bool, int]:
    """Preferred cells first, then the lowest seed."""
    return (prefer is not None and row["key"] not in prefer, row["config"]["seed"])


def attention_blocks(
    store: ResultsStore,
    folder: Path,
    keys: set[str] | None = None,
    prefer: set[str] | None = None,
    progress: Steps | None = None,
) -> list[tuple]:
    """Report blocks (see ablations.report_pages) with one attention-map figure per (task, size,
    mechanism): its lowest-seed finished cell with recorded maps (among the cells of `prefer`
    where it has any, e.g. those of its selected setting), written into `folder` as
    attention_<slug>_<hash>.png; [] when no finished cell kept maps or a checkpoint. A map whose
    maps file cannot be loaded, a (task, size, mechanism) with no maps file while others have
    one (or kept a checkpoint), and a mechanism without attention weights get a one-line note
    instead (the cell and why). Reads the recorded maps only: no model is built or run.
    `keys`: only these cells (default: every cell of the store). `progress` (ablations.steps)
    counts the maps, one step each."""
    chosen: dict[tuple, dict] = {}
    lacking: dict[tuple, dict] = {}  # finished, but no cell of theirs has a maps file
    for row in store.rows():
        if keys is not None and row["key"] not in keys:
            continue
        config = row["config"]
        kind = (config["task"], config["size"]["label"], config["mechanism"])
        if row["status"] != "done":
            continue
        pool = chosen if store.maps_path(row["key"]).is_file() else lacking
        if kind not in pool or _rank(row, prefer) < _rank(pool[kind], prefer):
            pool[kind] = row
    checkpointed = any(store.checkpoint_path(row["key"]).is_file() for row in lacking.values())
    if not chosen and not checkpointed:
        return []
    blocks = [
        ("h2", "Attention maps"),
        ("p", "Attention weights per head (rows: queries, columns: keys) and, for relational "
              "attention, the relation tensors r_ij per relation, of each mechanism's trained "
              "model (lowest seed) on the first test example, recorded when the cell finished; "
              "axes show the input tokens."),
    ]  # fmt: skip
    notes = [
        f"{_cell_name(row)}: no attention map, "
        + (
            "its maps file is missing"
            if store.checkpoint_path(row["key"]).is_file()
            else "no checkpoint kept (maps are recorded in grids with checkpoints = true)"
        )
        for kind, row in sorted(lacking.items())
        if kind not in chosen
    ]
    progress = progress or Steps()
    progress.expect(len(chosen))
    for kind, row in sorted(chosen.items()):
        progress.doing(f"attention map {' / '.join(kind)}")
        block = _map_block(store, folder, kind, row)
        if isinstance(block, str):
            notes.append(block)
        else:
            blocks.append(block)
        progress.advance()
    if notes:
        blocks += [("p", "Attention maps left out:"), ("ul", notes)]
    return blocks


def _map_block(store: ResultsStore, folder: Path, kind: tuple, row: dict) -> tuple | str:
    """The ("img", file, alt) block of the attention maps of cell `row`, of (task, size,
    mechanism) `kind`, written into `folder`; or, where it has none, the note saying why."""
    try:
        record = load_cell_maps(store, row)
    except MapsError as err:
        return f"{_cell_name(row)}: no attention map, its maps file cannot be loaded ({err.reason})"
    except FileNotFoundError:  # removed since it was listed
        return f"{_cell_name(row)}: no attention map, its maps file is missing"
    if record.get("error"):
        reason = f"recording it failed when the cell finished ({error_summary(record['error'])})"
        return f"{_cell_name(row)}: no attention map, {reason}"
    if not record["maps"]:
        name = row["config"]["mechanism_name"]
        return f"{_cell_name(row)}: no attention map, {name} attention has no weights"
    name = label_file_name("attention", kind)
    _figure(record, row).savefig(path_in(folder, name), dpi=80)
    return ("img", name, f"{' / '.join(kind)}: attention maps")


def _cell_name(row: dict) -> str:
    """'task / size / mechanism / seed N (cell <key prefix>)'."""
    config = row["config"]
    return (
        f"{config['task']} / {config['size']['label']} / {config['mechanism']} / seed "
        f"{config['seed']} (cell {row['key'][:12]})"
    )
