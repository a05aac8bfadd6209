"""Sigmoid attention, materialised: the ground truth (Ramapuram et al., "Theory, Analysis, and
Best Practices for Sigmoid Self-Attention", arXiv 2409.04431).

    out_i = sum_j sigmoid(s_ij) v_j,     s_ij = scale * <q_i, k_j> + b   (+ an additive mask)

over allowed keys j only: a masked key contributes 0 (s_ij = -inf), so a row with no allowed
key gives zeros. No normaliser: each weight is its own sigmoid, in (0, 1). Works in any float
dtype, float64 included; half-precision inputs are computed in float32. Memory O(B H N M).
"""

import torch
from einops import einsum

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.sigmoid.family import FEATURES
from attn_zoo.kernels.softmax.masks import allowed_keys, is_additive
from attn_zoo.kernels.softmax.naive import upcast_half


def sigmoid_weights(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    bias: float = 0.0,
) -> torch.Tensor:  # (B, H, N, M), float32 or wider
    """The weights sigmoid(s_ij), materialised; 0 where the mask or causality forbids."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = upcast_half(q), repeat_kv(upcast_half(k), q.shape[1])
    scores = einsum(q, k, "b h n d, b h m d -> b h n m") * scale + bias
    mask = allowed_keys(attn_mask, is_causal, q.shape[2], k.shape[2], q.device)
    if is_additive(mask):
        return torch.sigmoid(scores + mask)  # sigmoid(-inf) = 0
    weights = torch.sigmoid(scores)
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


@register_backend("sigmoid", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES))
def naive(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    bias: float = 0.0,
) -> torch.Tensor:  # (B, H, N, dv)
    weights = sigmoid_weights(q, k, attn_mask, is_causal, scale, bias)
    v = repeat_kv(upcast_half(v), q.shape[1])
    return einsum(weights, v, "b h n m, b h m d -> b h n d").to(q.dtype)
