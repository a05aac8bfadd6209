"""Port modules and checkpoints of the `dual-attention` package (Altabaa & Lafferty, v0.0.7).

    from attn_zoo.interop.dual_attention import port, convert_state_dict
    ours = port(reference_module)            # same outputs (float64: to 1e-10), our backends
    ours.load_state_dict(convert_state_dict(reference_checkpoint))

Ported classes: Attention, RelationalAttention, DualAttention, SymbolicAttention,
PositionalSymbolRetriever, PositionRelativeSymbolRetriever. Parameter names are the same, so
a checkpoint converts by dropping torch.compile's ``_orig_mod.`` prefix.

Calling convention: the reference's RelationalAttention takes position-relative symbols as an
(N, N, d) tensor; ours takes the `RelativeSymbols` our PositionRelativeSymbolRetriever returns
(never expanded to N x N x d). RoPE tables go in as ``rope=Rotary(cos, sin)``.

Deliberate differences: a query row with no allowed key gives zeros here and NaN in the
reference (RelationalAttention, and Attention on its manual path); SymbolicAttention's
dropout acts in training only (the reference applies it in eval too), so a ported retriever
with dropout > 0 matches in eval only when the reference's dropout is 0. A full digest of the
reference is in dual_attention_reference.md beside this file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from attn_zoo.kernels.dispatch import unknown_name_error
from attn_zoo.mechanisms import (
    AttentionMechanism,
    DualAttention,
    RelationalAttention,
    StandardAttention,
)
from attn_zoo.symbols import (
    PositionalSymbolRetriever,
    PositionRelativeSymbolRetriever,
    SymbolicAttention,
)


def _attributes(module: nn.Module, names: list[str]) -> dict:
    return {name: getattr(module, name) for name in names}


def _standard(m) -> nn.Module:
    kwargs = _attributes(
        m,
        [
            "d_model",
            "n_heads",
            "dropout",
            "key_dim",
            "n_kv_heads",
            "add_bias_kv",
            "add_bias_out",
            "total_n_heads",
        ],
    )
    return StandardAttention(**kwargs)


RELATIONAL_KWARGS = [
    "d_model", "n_heads", "n_relations", "dropout", "key_dim", "n_kv_heads", "rel_activation",
    "rel_proj_dim", "add_bias_kv", "add_bias_out", "total_n_heads", "symmetric_rels",
    "use_relative_positional_symbols",
]  # fmt: skip


def _relational(m) -> nn.Module:
    return RelationalAttention(**_attributes(m, RELATIONAL_KWARGS))


def _dual(m) -> nn.Module:
    kwargs = _attributes(
        m, ["d_model", "n_heads_sa", "n_heads_ra", "dropout", "share_attn_params", "ra_type"]
    )
    return DualAttention(**kwargs, sa_kwargs=dict(m.sa_kwargs), ra_kwargs=dict(m.ra_kwargs))


PORTERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "Attention": _standard,
    "RelationalAttention": _relational,
    "DualAttention": _dual,
    "SymbolicAttention": lambda m: SymbolicAttention(
        **_attributes(
            m, ["d_model", "n_heads", "n_symbols", "dropout", "scale", "trainable_symbols"]
        )
    ),
    "PositionalSymbolRetriever": lambda m: PositionalSymbolRetriever(
        **_attributes(m, ["symbol_dim", "max_length", "sinusoidal"])
    ),
    "PositionRelativeSymbolRetriever": lambda m: PositionRelativeSymbolRetriever(
        **_attributes(m, ["symbol_dim", "max_rel_pos"])
    ),
}


def convert_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A reference checkpoint's state dict in our names (torch.compile's prefix dropped)."""
    return {key.replace("_orig_mod.", ""): value for key, value in state_dict.items()}


def port(module: nn.Module, backend: str = "auto") -> nn.Module:
    """Our module equivalent to the reference `module`, with its weights, dtype, device and
    train/eval mode. `backend` sets the attention backend of the ported mechanisms."""
    name = type(module).__name__
    if not type(module).__module__.startswith("dual_attention") or name not in PORTERS:
        raise unknown_name_error(f"dual_attention class ({type(module).__module__})", name, PORTERS)
    ours = PORTERS[name](module)
    reference = next(iter(module.state_dict().values()))
    ours.to(dtype=reference.dtype, device=reference.device)
    ours.load_state_dict(convert_state_dict(module.state_dict()))
    if isinstance(ours, AttentionMechanism):
        ours.backend = backend
    return ours.train(module.training)
