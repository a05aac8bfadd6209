"""The model a grid cell trains: the model family its task's kind needs (`MODEL_FOR_KIND`),
sized and configured by the cell's `size` (ablations.grid.cell: d_model, n_layers and the model
options), with the cell's mechanism, and the forward call of one batch. A mechanism that names
a reference model (ablations.grid.references) builds that model instead, and a size naming a
teacher (ablations.grid.teacher: a Hugging Face causal LM in a local folder) builds the teacher
with its attention swapped for the mechanism. `load_cell_model`: the trained model of a stored
cell that kept its checkpoint.

Model options of a cell's size: the `BlockConfig` fields in `BLOCK_OPTIONS` (every kind), and
the model's own options (`KindModel.options`: pos_enc, pool, final_norm; those of the kind
only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ablations.grid.cell import Cell
from ablations.grid.references import REFERENCES, build_reference
from ablations.grid.teacher import TEACHER_OPTIONS, build_teacher_model, has_teacher
from ablations.labels import one_line
from ablations.tasks import IGNORE_INDEX, build_task
from attn_zoo.mechanisms.registry import MECHANISMS
from attn_zoo.models import (
    BlockConfig,
    LanguageModel,
    Seq2Seq,
    SequenceClassifier,
    VisionClassifier,
)

if TYPE_CHECKING:
    from ablations.results.store import ResultsStore

# BlockConfig fields a grid may set (d_model, attention and its kwargs come from the cell)
BLOCK_OPTIONS = (
    "dff", "dropout", "activation", "norm_type", "norm_first", "bias", "attention_residual",
    "symbol_retrieval", "symbol_retrieval_kwargs", "shared_symbol_retriever",
)  # fmt: skip


def _plain_forward(model: nn.Module, task, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    logits, loss = model(x, y)
    return logits, loss, y


def _teacher_forced(model: nn.Module, task, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The decoder reads ``y[:, :-1]`` (padding as the task's pad token), scored on ``y[:, 1:]``."""
    decoder_in = y[:, :-1].masked_fill(y[:, :-1] == IGNORE_INDEX, task.pad_token)
    logits, loss = model(x, decoder_in, y[:, 1:])
    return logits, loss, y[:, 1:]


@dataclass(frozen=True)
class KindModel:
    """How a task kind is trained: its model (from the task, the block config, the depth and
    the model's own `options`, e.g. pos_enc) and the forward call of one batch -> (logits,
    loss, scored targets)."""

    build: Callable[..., nn.Module]
    forward: Callable[[nn.Module, object, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]
    options: tuple[str, ...] = ()


MODEL_FOR_KIND: dict[str, KindModel] = {
    "classification": KindModel(
        lambda task, config, n_layers, **options: SequenceClassifier(
            task.vocab_size,
            task.num_classes,
            n_layers=n_layers,
            max_len=task.seq_len,
            config=config,
            input_dim=getattr(task, "input_dim", None),  # vector inputs (match_pattern)
            **options,
        ),  # fmt: skip
        _plain_forward,
        ("pos_enc", "pool"),
    ),
    "language_model": KindModel(
        lambda task, config, n_layers, **options: LanguageModel(
            task.vocab_size,
            n_layers=n_layers,
            max_block_size=task.seq_len,
            config=config,
            **options,
        ),  # fmt: skip
        _plain_forward,
        ("pos_enc",),
    ),
    "image_classification": KindModel(
        lambda task, config, n_layers, **options: VisionClassifier(
            task.image_shape,
            task.patch_size,
            task.num_classes,
            n_layers=n_layers,
            config=config,
            **options,
        ),  # fmt: skip
        _plain_forward,
        ("pool", "final_norm"),
    ),
    "seq2seq": KindModel(
        lambda task, config, n_layers, **options: Seq2Seq(
            task.vocab_size,
            task.vocab_size,
            n_layers_enc=n_layers,
            n_layers_dec=n_layers,
            encoder_attention=config.attention,
            encoder_attention_kwargs=config.attention_kwargs,
            decoder_attention=config.attention,
            decoder_attention_kwargs=config.attention_kwargs,
            in_block_size=task.seq_len,
            out_block_size=task.target_len,
            config=config,
            **options,
        ),  # fmt: skip
        _teacher_forced,
        ("pos_enc",),
    ),
}
MODEL_OPTIONS = tuple(dict.fromkeys(o for kind in MODEL_FOR_KIND.values() for o in kind.options))


def build_cell_model(cell: Cell, task) -> nn.Module:
    """The model family the task's kind needs, sized and configured by the cell's size, with
    its mechanism (or the reference model its mechanism names: ablations.grid.references; or
    the teacher its size names, swapped: ablations.grid.teacher); ValueError naming a model
    option the kind's model does not take, or a causal-only mechanism (gla) on a task whose
    model is not a language model."""
    kind = MODEL_FOR_KIND[task.kind]
    size = cell.size
    if has_teacher(size):
        return build_teacher_model(
            size, cell.folder, task, cell.mechanism_name, cell.mechanism_kwargs,
            cell.training.steps,
        )  # fmt: skip
    distilling = [key for key in TEACHER_OPTIONS if key in size]
    if distilling:
        raise ValueError(
            f"model options {distilling} distil a teacher's model: set model.teacher (a "
            "save_pretrained folder) or leave them out"
        )
    if cell.mechanism_name in REFERENCES:
        return build_reference(cell.mechanism_name, task, size, cell.mechanism_kwargs)
    if task.kind != "language_model" and MECHANISMS[cell.mechanism_name].causal_only:
        how = "reads its input both ways"
        if task.kind == "seq2seq":
            how = "puts it in its encoder too, which reads the source both ways"
        raise ValueError(
            f"mechanism {cell.mechanism_name!r} is causal only, and a grid's {task.kind} model "
            f"{how}: train it on language_model tasks"
        )
    options = {k: v for k, v in size.items() if k in MODEL_OPTIONS}
    for key in options:
        if key not in kind.options:
            raise ValueError(
                f"model option {key}={options[key]!r} is not one of {task.kind} models "
                f"(valid there: {', '.join(kind.options) or 'none'})"
            )
    config = BlockConfig(
        d_model=size["d_model"],
        attention=cell.mechanism_name,
        attention_kwargs=cell.mechanism_kwargs,
        **{k: v for k, v in size.items() if k in BLOCK_OPTIONS},
    )
    return kind.build(task, config, size["n_layers"], **options)


def forward(model: nn.Module, task, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(logits, loss, scored targets) of one batch; seq2seq is teacher-forced."""
    return MODEL_FOR_KIND[task.kind].forward(model, task, x, y)


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
    model = build_cell_model(cell, task)
    try:
        model.load_state_dict(torch.load(path, weights_only=True))
    except Exception as err:  # torch raises OSError, RuntimeError, EOFError, pickle errors...
        raise CheckpointError(
            f"checkpoint of cell {row['key']} at {path} cannot be loaded: {one_line(err)}"
        ) from err
    return model, task
