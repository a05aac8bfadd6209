"""Attention maps of trained cells, drawn from the maps recorded when each cell finished: every
attention module's weights (and relation tensors) per head, on one fixed test example.

    figure = cell_attention_figure(store, row)       # a row of ResultsStore.rows(), status done
    blocks = attention_blocks(store, folder)         # the report's "Attention maps" section

In a grid that keeps checkpoints (``checkpoints = true`` in its spec), the worker that trained a
cell records the attention maps of its trained model on one test example of its seed
(`ablations.run.train.MAPS_EXAMPLE`; see `ablations.run.train.attention_record`) and the driver
writes them to `ResultsStore.maps_path`, beside the checkpoint; drawing them here runs no model. A
mechanism without attention weights (linear, additive) has an empty record. A maps file that is
missing or cannot be loaded (truncated, corrupt, not a maps record) skips that map with a
one-line note in the section, naming the cell and why; it never fails the report.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ablations.labels import one_line
from ablations.report.folder import new_file
from ablations.report.pages import (
    Bullets,
    Image,
    Paragraph,
    Section,
    label_file_name,
    path_in,
    plot_text,
)
from ablations.results.cells_file import ATTENTION_FILE
from ablations.results.store import ResultsStore, error_summary
from ablations.steps import Steps
from attn_zoo.maps import plot_attention_maps

NOTE_LENGTH = 200  # at most this many characters of an error in a skipped map's note


class MapsError(RuntimeError):
    """A cell's maps file exists but cannot be loaded, or is not a record of attention maps;
    `reason` says why in one short line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def load_cell_maps(store: ResultsStore, row: dict) -> dict:
    """The attention maps recorded when the stored cell finished (see
    `ablations.run.train.attention_record`: example, labels, target, maps); FileNotFoundError
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
        reason = one_line(err, NOTE_LENGTH)
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


def _figure(record: dict, row: dict) -> Figure:
    config = row["config"]
    title = (
        f"{config['task']} / {config['mechanism']} / seed {config['seed']}: test example "
        f"{record['example']}, label {record['target']}"
    )
    return plot_attention_maps(record["maps"], labels=record["labels"], title=plot_text(title))


def cell_attention_figure(store: ResultsStore, row: dict) -> Figure:
    """Heatmaps of the stored cell's attention on the test example its maps were recorded on
    (`ablations.run.train.MAPS_EXAMPLE` of its seed); errors as `load_cell_maps` (MapsError too
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
    """Report blocks (see ablations.report.pages) with one attention-map figure per (task, size,
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


def attention_sections(
    store: ResultsStore,
    folder: Path,
    keys: set[str] | None = None,
    prefer: set[str] | None = None,
    progress: Steps | None = None,
) -> list[Section]:
    """The "Attention maps" section (none without maps) from `attention_blocks`: ("h2",
    heading) then ("p", text), ("ul", items) and ("img", file, alt) parts."""
    blocks = attention_blocks(store, folder, keys, prefer, progress)
    if not blocks:
        return []
    _write_attention_file(folder, blocks)
    return [_blocks_section(blocks)]


def _write_attention_file(folder: Path, blocks: list) -> None:
    """The attention-map `blocks` as attention.json in `folder`: what a report rebuilt from the
    cells.csv beside it reads back (ablations.results.cells_file.read_attention) to carry the
    maps over."""
    new_file(folder, ATTENTION_FILE).write_text(json.dumps(blocks), encoding="utf-8")


def _blocks_section(blocks: list, first: Sequence[Paragraph] = ()) -> Section:
    """The section of attention-map `blocks` (("h2", heading), then ("p", text), ("ul", items)
    and ("img", file, alt)), the paragraphs `first` before them."""
    (_, heading), *parts = blocks
    kinds = {"p": Paragraph, "ul": Bullets, "img": Image}
    return Section(heading, [*first, *(kinds[kind](*content) for kind, *content in parts)])


def carried_attention_sections(
    attention: tuple[list[list], dict[str, bytes]], folder: Path
) -> list[Section]:
    """The attention maps of the report a cells.csv came from (`CellsFile.attention`: its blocks
    and PNG files), written into `folder` again with their attention.json, so that rebuilding a
    report from its cells.csv keeps them; an image whose file was not beside the cells.csv is
    named in a note instead."""
    blocks, files = attention
    missing = list(dict.fromkeys(n for kind, n, *_ in blocks if kind == "img" and n not in files))
    kept = [block for block in blocks if block[0] != "img" or block[1] in files]
    for name, data in files.items():
        new_file(folder, name).write_bytes(data)
    _write_attention_file(folder, blocks)  # the missing images too: a rebuild names them again
    lead = "Carried over" if files else "Nothing carried over"
    first = [Paragraph(
        f"{lead} from the report whose cells.csv this one was rebuilt from (maps are drawn "
        "from the files beside a store, which a cells.csv does not hold)."
        + (f" Not carried, their files missing beside the cells.csv: {', '.join(missing)}."
           if missing else "")
    )]  # fmt: skip
    return [_blocks_section(kept, first)]
