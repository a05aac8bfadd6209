"""Attention maps of trained cells: rebuild a cell's model from its checkpoint, run it on one
test example and draw every attention module's weights (and relation tensors) per head.

    figure = cell_attention_figure(store, row)       # a row of ResultsStore.rows(), status done
    blocks = attention_blocks(store, folder)         # the report's "Attention maps" section

Needs the grid to have kept checkpoints (``checkpoints = true`` in its spec). A checkpoint
that is missing or cannot be loaded (truncated, corrupt, not the cell's model) skips that map
with a one-line note in the section, naming the cell and why; it never fails the report.
"""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.figure import Figure

from ablations.report_pages import label_file_name, path_in, plot_text
from ablations.spec import Cell
from ablations.store import ResultsStore
from ablations.tasks import build_task
from ablations.train import build_model, forward
from attn_zoo.maps import plot_attention_maps, recording_attention

NOTE_LENGTH = 200  # at most this many characters of an error in a skipped map's note


class CheckpointError(RuntimeError):
    """A cell's checkpoint file exists but cannot be loaded into the cell's model."""


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
    model = build_model(cell, task)
    try:
        model.load_state_dict(torch.load(path, weights_only=True))
    except Exception as err:  # torch raises OSError, RuntimeError, EOFError, pickle errors...
        raise CheckpointError(
            f"checkpoint of cell {row['key']} at {path} cannot be loaded: {_one_line(err)}"
        ) from err
    return model, task


def _one_line(err: BaseException) -> str:
    """'Type: first line of the message', at most NOTE_LENGTH characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= NOTE_LENGTH else text[: NOTE_LENGTH - 3] + "..."


def cell_attention_figure(store: ResultsStore, row: dict, example: int = 0) -> Figure:
    """Heatmaps of the stored cell's attention on test example `example` of its seed."""
    model, task = load_cell_model(store, row)
    test = task.splits(row["config"]["seed"])["test"]
    x, y = test.inputs[example : example + 1], test.targets[example : example + 1]
    with recording_attention(model) as maps:
        forward(model, task, x, y)
    labels = [str(int(t)) for t in x[0]] if x.dtype == torch.long else None
    config = row["config"]
    title = (
        f"{config['task']} / {config['mechanism']} / seed {config['seed']}: test example "
        f"{example}, label {y[0].tolist()}"
    )
    return plot_attention_maps(maps, labels=labels, title=plot_text(title))


def attention_blocks(store: ResultsStore, folder: Path) -> list[tuple]:
    """Report blocks (see attn_zoo.report_pages) with one attention-map figure per (task, size,
    mechanism): its lowest-seed finished cell that kept a checkpoint, written into `folder` as
    attention_<slug>_<hash>.png; [] when no finished cell kept one. A map whose checkpoint
    cannot be loaded, or a (task, size, mechanism) with no checkpoint while others have one,
    gets a one-line note instead (the cell and why)."""
    chosen: dict[tuple, dict] = {}
    lacking: dict[tuple, dict] = {}  # finished, but no cell of theirs kept a checkpoint
    for row in store.rows():
        config = row["config"]
        kind = (config["task"], config["size"]["label"], config["mechanism"])
        if row["status"] != "done":
            continue
        pool = chosen if store.checkpoint_path(row["key"]).is_file() else lacking
        if kind not in pool or config["seed"] < pool[kind]["config"]["seed"]:
            pool[kind] = row
    if not chosen:
        return []
    blocks = [
        ("h2", "Attention maps"),
        ("p", "Attention weights per head (rows: queries, columns: keys) and, for relational "
              "attention, the relation tensors r_ij per relation, of each mechanism's trained "
              "model (lowest seed) on the first test example; axes show the input tokens."),
    ]  # fmt: skip
    notes = [
        f"{_cell_name(row)}: no attention map, no checkpoint kept"
        for kind, row in sorted(lacking.items())
        if kind not in chosen
    ]
    for (task, size, mechanism), row in sorted(chosen.items()):
        try:
            figure = cell_attention_figure(store, row)
        except CheckpointError as err:
            reason = f"its checkpoint cannot be loaded ({_one_line(err.__cause__ or err)})"
            notes.append(f"{_cell_name(row)}: no attention map, {reason}")
            continue
        except FileNotFoundError:
            if store.checkpoint_path(row["key"]).is_file():
                raise  # another file is missing: not the checkpoint
            notes.append(f"{_cell_name(row)}: no attention map, its checkpoint is missing")
            continue
        name = label_file_name("attention", (task, size, mechanism))
        figure.savefig(path_in(folder, name), dpi=80)
        blocks.append(("img", name, f"{task} / {size} / {mechanism}: attention maps"))
    if notes:
        blocks += [("p", "Attention maps left out:"), ("ul", notes)]
    return blocks


def _cell_name(row: dict) -> str:
    """'task / size / mechanism / seed N (cell <key prefix>)'."""
    config = row["config"]
    return (
        f"{config['task']} / {config['size']['label']} / {config['mechanism']} / seed "
        f"{config['seed']} (cell {row['key'][:12]})"
    )
