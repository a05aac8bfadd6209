"""Attention maps of trained cells: rebuild a cell's model from its checkpoint, run it on one
test example and draw every attention module's weights (and relation tensors) per head.

    figure = cell_attention_figure(store, row)       # a row of ResultsStore.rows(), status done
    blocks = attention_blocks(store, folder)         # the report's "Attention maps" section

Needs the grid to have kept checkpoints (``checkpoints = true`` in its spec).
"""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.figure import Figure

from ablations.report_pages import file_name
from ablations.spec import Cell
from ablations.store import ResultsStore
from ablations.tasks import build_task
from ablations.train import build_model, forward
from attn_zoo.maps import plot_attention_maps, recording_attention


def load_cell_model(store: ResultsStore, row: dict) -> tuple[torch.nn.Module, object]:
    """The trained model of a stored cell and its task; FileNotFoundError without checkpoint."""
    path = store.checkpoint_path(row["key"])
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint for cell {row['key']} at {path}: run the grid with checkpoints = true"
        )
    cell = Cell(**row["config"])
    task = build_task(cell.task_name, **cell.task_kwargs)
    model = build_model(cell, task)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model, task


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
    return plot_attention_maps(maps, labels=labels, title=title)


def attention_blocks(store: ResultsStore, folder: Path) -> list[tuple]:
    """Report blocks (see attn_zoo.report_pages) with one attention-map figure per (task, size,
    mechanism): its lowest-seed finished cell that kept a checkpoint; [] when none did."""
    chosen: dict[tuple, dict] = {}
    for row in store.rows():
        config = row["config"]
        kind = (config["task"], config["size"]["label"], config["mechanism"])
        if row["status"] != "done" or not store.checkpoint_path(row["key"]).is_file():
            continue
        if kind not in chosen or config["seed"] < chosen[kind]["config"]["seed"]:
            chosen[kind] = row
    if not chosen:
        return []
    blocks = [
        ("h2", "Attention maps"),
        ("p", "Attention weights per head (rows: queries, columns: keys) and, for relational "
              "attention, the relation tensors r_ij per relation, of each mechanism's trained "
              "model (lowest seed) on the first test example; axes show the input tokens."),
    ]  # fmt: skip
    for (task, size, mechanism), row in sorted(chosen.items()):
        name = file_name("attention", f"{task}_{size}_{mechanism}")
        cell_attention_figure(store, row).savefig(folder / name, dpi=80)
        blocks.append(("img", name, f"{task} / {size} / {mechanism}: attention maps"))
    return blocks
