"""The softmax attention kernel family and its backends.

    softmax_attention(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0,
                      backend="auto", score_mod=None, mask_mod=None) -> (B, H, N, dv)

Inputs and features: family.py. Backends, each registering itself in its own file: naive
(the ground truth), chunked (online softmax, O(N) memory), sdpa (torch SDPA), flex
(FlexAttention, CUDA only), xformers (CUDA). Mask mods (mods.py) combine with and_masks,
or_masks and not_mask; block_mask (blocks.py) says which tiles of a mask mod are empty, full
or partial.
"""

import torch

from attn_zoo.kernels.softmax import chunked, flex, naive, sdpa, xformers  # noqa: F401 (register)
from attn_zoo.kernels.softmax.blocks import block_mask
from attn_zoo.kernels.softmax.family import SOFTMAX, check_mask, check_qkv, describe_call
from attn_zoo.kernels.softmax.mods import (
    MODS,
    MaskMod,
    ScoreMod,
    and_masks,
    build_mod,
    not_mask,
    or_masks,
)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    score_mod: ScoreMod | None = None,
    mask_mod: MaskMod | None = None,
) -> torch.Tensor:
    """Softmax attention by the named backend (see family.py), with FlexAttention-style score
    and mask mods (mods.py); (B, H, N, dv)."""
    return SOFTMAX(
        backend, q=q, k=k, v=v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        dropout_p=dropout_p, score_mod=score_mod, mask_mod=mask_mod,
    )  # fmt: skip


__all__ = [
    "MODS",
    "SOFTMAX",
    "and_masks",
    "block_mask",
    "build_mod",
    "check_mask",
    "check_qkv",
    "describe_call",
    "not_mask",
    "or_masks",
    "softmax_attention",
]
