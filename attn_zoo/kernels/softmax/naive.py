"""Softmax attention, materialised: the ground truth every other backend is tested against.

    out_i = sum_j p_ij v_j,   p_ij = exp(s_ij) / sum_j' exp(s_ij'),   s_ij = scale * <q_i, k_j>

over allowed keys j only; a row with no allowed key gives zeros. Works in any float dtype,
float64 included; half-precision inputs are computed in float32 (a reference, not a
half-precision kernel). Memory O(B H N M).
"""

import torch
import torch.nn.functional as F
from einops import einsum

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.softmax.family import FEATURES, MODS
from attn_zoo.kernels.softmax.masks import align_causal, allowed_keys, is_additive, restrict
from attn_zoo.kernels.softmax.mods import (
    MaskMod,
    ScoreMod,
    apply_score_mod,
    mask_from_mod,
    mod_indices,
)


def upcast_half(x: torch.Tensor) -> torch.Tensor:
    """float16 / bfloat16 -> float32; other dtypes unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim under `mask` (boolean: True = allowed; float: added to the
    scores); rows with nothing allowed are zero."""
    if is_additive(mask):
        scores = scores + mask
    elif mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if scores.shape[-1] == 0:  # no keys at all: every row is empty
        return scores
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)
    weights = torch.exp(scores - row_max)
    total = weights.sum(dim=-1, keepdim=True)
    return weights / torch.where(total == 0, 1.0, total)


def attention_weights(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    score_mod: ScoreMod | None = None,
    mask_mod: MaskMod | None = None,
) -> torch.Tensor:  # (B, H, N, M), float32 or wider
    """The weights p_ij, materialised (rows with nothing allowed are zero); any mask, causal
    alignment (see masks.py) and score and mask mods (mods.py: s_ij = score_mod(s_ij, b, h, i,
    j), keys where mask_mod is False masked)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = upcast_half(q), repeat_kv(upcast_half(k), q.shape[1])
    (b, h, n, _), m = q.shape, k.shape[2]
    attn_mask, is_causal = align_causal(attn_mask, is_causal, n, m, q.device)
    scores = einsum(q, k, "b h n d, b h m d -> b h n m") * scale
    scores = apply_score_mod(score_mod, scores, mod_indices(b, h, (0, n), (0, m), q.device))
    mask = allowed_keys(attn_mask, is_causal, n, m, q.device)
    if mask_mod is not None:
        mask = restrict(mask, mask_from_mod(mask_mod, b, h, n, m, q.device))
    return masked_softmax(scores, mask)


@register_backend(
    "softmax",
    "naive",
    tier="naive",
    priority=0,
    capabilities=Capabilities(FEATURES | MODS),
)
def naive(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    score_mod: ScoreMod | None = None,
    mask_mod: MaskMod | None = None,
) -> torch.Tensor:  # (B, H, N, dv)
    weights = attention_weights(q, k, attn_mask, is_causal, scale, score_mod, mask_mod)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    v = repeat_kv(upcast_half(v), q.shape[1])
    return einsum(weights, v, "b h n m, b h m d -> b h n d").to(q.dtype)
