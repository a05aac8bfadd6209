"""Attention maps of a model on real inputs, recorded from a forward pass, and their heatmaps.

    maps = record_attention_maps(model, x)    # {"blocks.0.attn": {"attention": (B, H, N, M)},
                                              #  "blocks.0.attn.relational_attention":
                                              #      {"attention": ..., "relations": (B, R, N, N)}}
    figure = plot_attention_maps(maps, example=0, labels=["7", "3", ...])

Every module with an `attention_maps(*args, **kwargs)` method (standard and relational
attention, so dual attention's two branches and cross-attention too) is hooked: the method
receives exactly the arguments of the module's forward call and returns its weights
materialised, so the maps are those of the pass the model really ran, masks and RoPE included.
Drawing needs matplotlib (an extra: pip install 'attn_zoo[ablations]'); recording does not.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@contextmanager
def recording_attention(model: nn.Module) -> Iterator[dict[str, dict[str, torch.Tensor]]]:
    """Within the block, `model` runs in eval mode without gradients and every attention
    module's maps of the latest forward call are collected, by module name, into the dict."""
    modules = [
        (name, module)
        for name, module in model.named_modules()
        if callable(getattr(module, "attention_maps", None))
    ]
    if not modules:
        raise ValueError(
            f"{type(model).__name__} has no module with attention_maps(): only standard and "
            "relational attention (and mechanisms built from them, e.g. dual) record maps"
        )
    maps: dict[str, dict[str, torch.Tensor]] = {}
    names = {module: name or type(module).__name__ for name, module in modules}

    def hook(module, args, kwargs):
        maps[names[module]] = {
            kind: value.detach().cpu()
            for kind, value in module.attention_maps(*args, **kwargs).items()
        }

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for _, m in modules]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield maps
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()


def record_attention_maps(
    model: nn.Module, *inputs, **kwargs
) -> dict[str, dict[str, torch.Tensor]]:
    """Run `model(*inputs, **kwargs)` in eval mode; every attention module's maps by name."""
    with recording_attention(model) as maps:
        model(*inputs, **kwargs)
    return maps


def _colour_scale(kind: str, maps: torch.Tensor) -> tuple[str, float, float, str]:
    """(colour map, vmin, vmax, colour bar label) of one row of maps of `kind`.

    Attention weights in [0, 1] keep the scale [0, 1]; relations r_ij^l, and weights outside
    [0, 1] (differential attention's softmax1 - lambda softmax2), get a diverging scale
    symmetric about 0 that spans the row's values (its finite ones: NaN and inf, as of a
    diverged model, do not set the scale)."""
    finite = maps[maps.isfinite()]
    low, high = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 1.0)
    if kind != "relations" and low >= 0 and high <= 1:
        return "viridis", 0.0, 1.0, "weight"
    bound = max(-low, high, 1e-6)
    what = "relation" if kind == "relations" else "weight, outside [0, 1]"
    return "RdBu_r", -bound, bound, f"{what}: scale centred on 0"


def plot_attention_maps(
    maps: dict[str, dict[str, torch.Tensor]],
    example: int = 0,
    labels: list[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Heatmaps of one example: a row per (module, kind), a column per head or relation.

    Attention rows are queries, columns keys; each row of maps has one colour scale
    (`_colour_scale`): [0, 1] for attention weights, diverging and centred on 0 for relation
    maps r_ij^l and for weights outside [0, 1] (differential attention), as its colour bar
    says. `labels` names the N positions on the axes."""
    from matplotlib.figure import Figure

    rows = [
        (name, kind, tensor[example])
        for name, kinds in maps.items()
        for kind, tensor in kinds.items()
    ]
    columns = max(t.shape[0] for *_, t in rows)
    size = max(2.6, 1.2 + 0.12 * rows[0][2].shape[-1])  # inches per map
    figure = Figure(figsize=(size * columns, size * len(rows)), layout="constrained")
    axes = figure.subplots(len(rows), columns, squeeze=False)
    for r, (name, kind, tensor) in enumerate(rows):
        cmap, vmin, vmax, label = _colour_scale(kind, tensor)
        for c in range(columns):
            ax = axes[r][c]
            if c >= tensor.shape[0]:
                ax.set_axis_off()
                continue
            grid = tensor[c].float().numpy()
            image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax)
            ax.set_title(
                f"{name}\n{kind} {'relation' if kind == 'relations' else 'head'} {c}", fontsize=7
            )
            if labels is not None and len(labels) == grid.shape[-1]:
                ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
            else:
                ax.set_xticks([])
            if labels is not None and len(labels) == grid.shape[0]:
                ax.set_yticks(range(len(labels)), labels, fontsize=6)
            else:
                ax.set_yticks([])
        figure.colorbar(image, ax=axes[r].tolist(), shrink=0.8).set_label(label, fontsize=7)
    if title:
        figure.suptitle("\n".join(textwrap.wrap(title, 45 * columns)), fontsize=9)
    return figure
