"""Reference models: the paper's own code trained by a grid beside ours, on the same data.

A [[mechanisms]] entry whose `name` is one of `REFERENCES` builds that class of the
`dual-attention` package (Altabaa & Lafferty's code; ``pip install dual-attention==0.0.7``)
instead of an attn_zoo model with a registered mechanism::

    [[mechanisms]]
    label = "ref_dat"
    name = "dual_attention.VisionDualAttnTransformer"
    kwargs = { n_heads_sa = 1, n_heads_ra = 1 }

Where its arguments come from, so that a reference and our model of the same cell size are
built alike (ablations.grid.cell_model):

- the task: image_shape, patch_size, num_classes (the reference reads image_shape as
  (channels, width, height) and patch_size as (width, height): passed so);
- the cell's size: d_model, n_layers, and the model options both take (dff, dropout as
  dropout_rate, activation, norm_first, norm_type, bias, pool), unset ones at our defaults
  (`BlockConfig`; dff `default_dff`; pool "cls"); an option the reference cannot vary
  (`FIXED_OPTIONS`: final_norm, attention_residual, shared_symbol_retriever) set to another
  value than the reference's is refused;
- the entry's kwargs: the class's other arguments (`Reference.kwargs`). The DAT's
  symbol_retrieval and symbol_retrieval_kwargs default to the size's (as our dual attention
  reads them); the retriever's width (symbol_dim, or d_model for symbolic_attention) and its
  length (max_length, max_rel_pos: the number of tokens, patches + cls) are filled in where
  the kwargs leave them out.

The reference returns logits; `WithLoss` adds the mean cross-entropy as our models do. Known
differences from our VisionClassifier, kept (they are what an attribution measures): the
reference has no final norm (`model.final_norm = false` removes ours), and its `bias` also
sets the attention output biases
(attn_zoo/interop/dual_attention_models.py lists them with the other reference behaviours).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attn_zoo.models import BlockConfig
from attn_zoo.models.feedforward import default_dff

PACKAGE = "dual-attention==0.0.7"
# model options both take (pool besides these BlockConfig fields)
SHARED_OPTIONS = ("dff", "dropout", "activation", "norm_first", "norm_type", "bias")
# model options a reference cannot vary: its fixed value, and what it has
FIXED_OPTIONS = {
    "final_norm": (False, "has no final norm"),
    "attention_residual": (True, "has a residual around attention"),
    "shared_symbol_retriever": (True, "shares one symbol retriever between its layers"),
}
RETRIEVER_WIDTH = {"symbolic_attention": "d_model"}  # others: symbol_dim
RETRIEVER_LENGTH = {"positional_symbols": "max_length", "position_relative": "max_rel_pos"}


@dataclass(frozen=True)
class Reference:
    """A reference model class: where it lives, the task kind it trains on, and the kwargs
    a grid entry may give it (its other arguments come from the task and the size)."""

    module: str
    cls: str
    kind: str
    kwargs: tuple[str, ...]
    dual: bool = False  # takes symbol_retrieval (+ kwargs)


REFERENCES: dict[str, Reference] = {
    "dual_attention.VisionTransformer": Reference(
        "dual_attention.vision_models", "VisionTransformer", "image_classification", ("n_heads",)
    ),
    "dual_attention.VisionDualAttnTransformer": Reference(
        "dual_attention.vision_models",
        "VisionDualAttnTransformer",
        "image_classification",
        (
            "n_heads_sa",
            "n_heads_ra",
            "symbol_retrieval",
            "symbol_retrieval_kwargs",
            "ra_type",
            "ra_kwargs",
            "sa_kwargs",
        ),  # fmt: skip
        dual=True,
    ),
}


class WithLoss(nn.Module):
    """A classifier returning logits, returning (logits, mean cross-entropy) as ours do."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        logits = self.model(x)
        return logits, None if targets is None else F.cross_entropy(logits, targets)


def _reference_class(name: str) -> Callable[..., nn.Module]:
    reference = REFERENCES[name]
    try:
        module = importlib.import_module(reference.module)
    except ImportError as err:
        raise ImportError(
            f"mechanism {name!r} is a reference model of the dual-attention package, which is "
            f"not installed: pip install {PACKAGE}"
        ) from err
    return getattr(module, reference.cls)


def _retriever(name: str, kwargs: dict | None, d_model: int, tokens: int) -> dict:
    """The reference retriever's kwargs: `kwargs` with its width and length filled in."""
    filled = {RETRIEVER_WIDTH.get(name, "symbol_dim"): d_model}
    if name in RETRIEVER_LENGTH:
        filled[RETRIEVER_LENGTH[name]] = tokens
    return {**filled, **(kwargs or {})}


def build_reference(name: str, task, size: dict, kwargs: dict) -> nn.Module:
    """The reference model `name` for `task` at the cell's `size` (d_model, n_layers, model
    options) with the entry's `kwargs`, wrapped in `WithLoss`; ValueError naming a kwarg the
    class does not take or a task kind it does not train on."""
    reference = REFERENCES[name]
    for key, (fixed, has) in FIXED_OPTIONS.items():
        if size.get(key, fixed) != fixed:
            raise ValueError(f"mechanism {name!r} {has}: {key}={size[key]!r} cannot apply")
    if task.kind != reference.kind:
        raise ValueError(f"mechanism {name!r} trains {reference.kind} tasks, not {task.kind}")
    unknown = sorted(set(kwargs) - set(reference.kwargs))
    if unknown:
        raise ValueError(
            f"mechanism {name!r} takes kwargs {', '.join(reference.kwargs)}; got {unknown[0]!r}"
        )
    d_model = size["d_model"]
    config = BlockConfig(d_model=d_model, **{k: size[k] for k in SHARED_OPTIONS if k in size})
    dff = config.dff or default_dff(d_model, config.activation)
    channels, height, width = task.image_shape
    patch = task.patch_size
    patch_height, patch_width = (patch, patch) if isinstance(patch, int) else patch
    arguments = dict(kwargs)
    if reference.dual:
        retrieval = arguments.setdefault("symbol_retrieval", size.get("symbol_retrieval"))
        tokens = (height // patch_height) * (width // patch_width) + 1  # patches and cls
        arguments["symbol_retrieval_kwargs"] = _retriever(
            retrieval,
            arguments.get("symbol_retrieval_kwargs", size.get("symbol_retrieval_kwargs")),
            d_model,
            tokens,
        )
    model = _reference_class(name)(
        image_shape=(channels, width, height),
        patch_size=(patch_width, patch_height),
        num_classes=task.num_classes,
        d_model=d_model,
        n_layers=size["n_layers"],
        dff=dff,
        dropout_rate=config.dropout,
        activation=config.activation,
        norm_first=config.norm_first,
        norm_type=config.norm_type,
        bias=config.bias,
        pool=size.get("pool", "cls"),
        **arguments,
    )
    return WithLoss(model)
