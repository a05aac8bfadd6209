"""Port modules and checkpoints of the `axial-attention` package (lucidrains, v0.6.1).

    from attn_zoo.interop.axial_attention import port, convert_state_dict
    ours = port(reference)               # same outputs (float64: to 1e-10), our backends
    ours.load_state_dict(convert_state_dict(reference.state_dict()))

Ported class: AxialAttention (mechanism "axial"): dim -> d_model, heads -> n_heads,
dim_heads -> head_dim, num_dimensions -> n_axes, dim_index -> dim_index,
sum_axial_out -> combine ("sum" / "sequential"). Parameter names:

    axial_attentions.{a}.fn.to_q   -> axes.{a}.wq
    axial_attentions.{a}.fn.to_kv  -> axes.{a}.wk (first half of the rows), axes.{a}.wv
    axial_attentions.{a}.fn.to_out -> axes.{a}.wo
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

from attn_zoo.mechanisms import AxialAttention
from attn_zoo.registry import unknown_name_error

PORTED = ("AxialAttention",)
KEY = re.compile(r"^(?:_orig_mod\.)?axial_attentions\.(\d+)\.fn\.(to_q|to_kv|to_out)\.(\w+)$")


def convert_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A reference AxialAttention state dict in our names (to_kv split into wk and wv)."""
    converted = {}
    for key, value in state_dict.items():
        match = KEY.match(key)
        if match is None:
            raise ValueError(f"unexpected key {key!r} in an axial_attention.AxialAttention state")
        axis, layer, param = match.groups()
        prefix = f"axes.{axis}"
        if layer == "to_kv":
            k, v = value.chunk(2, dim=0)
            converted[f"{prefix}.wk.{param}"], converted[f"{prefix}.wv.{param}"] = k, v
        else:
            converted[f"{prefix}.{dict(to_q='wq', to_out='wo')[layer]}.{param}"] = value
    return converted


def port(module: nn.Module, backend: str = "auto") -> AxialAttention:
    """Our AxialAttention equivalent to the reference `module` (axial_attention.AxialAttention),
    with its weights, dtype, device and train/eval mode, running on `backend`."""
    name = type(module).__name__
    if not type(module).__module__.startswith("axial_attention") or name not in PORTED:
        raise unknown_name_error(f"axial_attention class ({type(module).__module__})", name, PORTED)
    first = module.axial_attentions[0].fn  # the reference's SelfAttention of the first axis
    ours = AxialAttention(
        d_model=module.dim,
        n_heads=first.heads,
        n_axes=module.total_dimensions - 2,
        head_dim=first.dim_heads,
        dim_index=module.dim_index,
        combine="sum" if module.sum_axial_out else "sequential",
        backend=backend,
    )
    reference = next(iter(module.state_dict().values()))
    ours.to(dtype=reference.dtype, device=reference.device)
    ours.load_state_dict(convert_state_dict(module.state_dict()))
    return ours.train(module.training)
