"""A trained cell's Hugging Face model saved as a save_pretrained folder: how a teacher for a
grid of attention replacements is made (ablations.grid.teacher; `make hf-teacher`).

    python -m ablations.run.export GRID OUT [--key KEY] [--force]

The cell (the grid's only one, or the one of key KEY) must have a `model.teacher` (a
`from_scratch` one trains the teacher's architecture), be `done` (not diverged, failed, ...)
and have kept its weights (the grid's `checkpoints = true`), every one of them finite, and its
data files and teacher folder files must be those it trained on (the digests its environment
records: an edited config.json would give the weights another model; `check_data`). Its
model is built as the cell built it, the weights loaded, low-rank adapters merged
(attn_zoo.interop.distill.merge_adapters), and ``save_pretrained`` writes it to OUT: a plain
causal LM, or one recording its swap (attn_zoo.interop.surgery.load_swapped). OUT must be new
or empty (it may be the teacher other grids name); --force writes over a folder that is not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ablations.grid.cell import Cell
from ablations.grid.cell_model import build_cell_model
from ablations.grid.spec import GridSpec, load_grid
from ablations.grid.teacher import CausalLM
from ablations.results.store import ResultsStore
from ablations.run.provenance import data_record, short_record
from ablations.tasks.registry import Task
from attn_zoo.interop.distill import merge_adapters


def export_cell(
    spec: GridSpec, out: str | Path, key: str | None = None, force: bool = False
) -> Path:
    """Save the trained model of `spec`'s cell `key` (default: its only cell) with
    save_pretrained into the folder `out` (written over where it holds files only with
    `force`); returns it. ValueError, before the model is built, where there is no such cell,
    it is not done, or `out` is a file or (without `force`) a folder that is not empty; where
    its data or teacher files differ from those it trained on (`check_data`; `force` does not
    override it), the cell has no Hugging Face model or a weight that is not finite;
    FileNotFoundError where its weights were not kept. Nothing is written before these."""
    cells = [cell for cell in spec.cells if key is None or cell.key == key]
    if len(cells) != 1:
        keys = ", ".join(f"{cell.key} ({cell})" for cell in spec.cells)
        what = f"no cell of key {key!r}" if key else f"{len(cells)} cells"
        raise ValueError(f"{spec.path}: {what}; name one with --key: {keys}")
    (cell,) = cells
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={str(out)!r} is a file: save_pretrained writes a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(
            f"out={str(out)!r} is a folder that is not empty (a model other grids may name as "
            "their teacher): name a new or empty folder, or pass --force to write over it"
        )
    with ResultsStore(spec.store, readonly=True) as store:
        status = store.status(cell.config())
        path = store.checkpoint_path(cell.key)
        row = next((row for row in store.rows() if row["key"] == cell.key), None)
    if status != "done":
        raise ValueError(
            f"cell {cell} (key {cell.key}) is {status or 'not run'}: only a done cell's weights "
            "are exported"
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"cell {cell} (key {cell.key}) kept no weights at {path}: run its grid with "
            "checkpoints = true"
        )
    task = cell.build_task()
    check_data(cell, task, (row["environment"] or {}).get("data"))
    model = build_cell_model(cell, task)
    if not isinstance(model, CausalLM):
        raise ValueError(
            f"cell {cell} (key {cell.key}) trains no Hugging Face model: only a cell with a "
            "model.teacher (from_scratch for a new teacher) exports one"
        )
    weights = torch.load(path, weights_only=True)
    bad = [name for name, tensor in weights.items() if not tensor.isfinite().all()]
    if bad:
        raise ValueError(
            f"cell {cell} (key {cell.key}) kept weights that are not finite in {len(bad)} "
            f"tensors ({', '.join(bad[:3])}{', ...' * (len(bad) > 3)}): a model to export has "
            "finite weights only"
        )
    model.load_state_dict(weights)
    merge_adapters(model.hf).save_pretrained(out)
    return out


def check_data(cell: Cell, task: Task, recorded: dict | None) -> None:
    """ValueError naming the files, where the data files and teacher folder files `cell` reads
    now (ablations.run.provenance.data_record) are not those it trained on (`recorded`: its
    environment's "data"), compared as ablations.run.provenance.mixed_provenance compares them
    (the digests in order; paths do not count): the weights would be saved with, say, another
    config.json than they trained with. A cell that recorded none (a store written before they
    were recorded) is not checked."""
    now = data_record(cell, task)
    if recorded is None or list(map(str, recorded.values())) == list(now.values()):
        return
    changes = {
        "changed": [path for path in now if path in recorded and str(recorded[path]) != now[path]],
        "not read then": [path for path in now if path not in recorded],
        "gone": [path for path in recorded if path not in now],
    }
    named = "; ".join(f"{how}: {', '.join(paths)}" for how, paths in changes.items() if paths)
    raise ValueError(
        f"cell {cell} (key {cell.key}) trained on the data files {short_record(recorded)}, "
        f"which are {short_record(now)} now ({named or 'in another order'}): its weights would "
        "be saved with files they were not trained with; restore those files as the cell read "
        "them, or train the cell again (--force does not override this: it is about OUT)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ablations.run.export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("grid", help="the grid file")
    parser.add_argument("out", help="the folder save_pretrained writes")
    parser.add_argument("--key", help="the cell's key (default: the grid's only cell)")
    parser.add_argument(
        "--force", action="store_true", help="write over an OUT folder that is not empty"
    )
    args = parser.parse_args(argv)
    try:
        out = export_cell(load_grid(args.grid), args.out, args.key, args.force)
    except (ValueError, FileNotFoundError) as err:  # a SpecError is a ValueError
        sys.exit(f"error: {err}")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
