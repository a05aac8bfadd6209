"""Relational attention by value augmentation on torch SDPA.

With identity activation, sum_j a_ij r_ij^l = rel_scale <qr_i^l, sum_j a_ij kr_j^l>: the
relational part is ordinary attention whose values are the relation keys, followed by a
per-position contraction with the relation queries. So one attention with values
[v | kr^1 .. kr^R] (width hd + R dr per kv head) gives everything, with the memory of the
underlying SDPA kernel (O(N) on the flash path).

The CPU flash kernel needs equal q/k/v widths: without dropout the values are split into
slices of the key width (one SDPA call each, all with the same weights); with dropout one call
on zero-padded q/k keeps a single dropout draw for all values.
Exact only for identity rel_activation and absolute symbols.
"""

import torch
from einops import einsum, rearrange, repeat

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.relational.family import FEATURES
from attn_zoo.kernels.relational.naive import default_scales
from attn_zoo.kernels.softmax.family import SATURATED_WHY
from attn_zoo.kernels.softmax.sdpa import sdpa


# Value augmentation on torch SDPA: the fused kernel on CUDA until `triton` has been timed there.
@register_backend(
    "relational",
    "sdpa",
    tier="fused",
    priority=30,
    capabilities=Capabilities(
        FEATURES - {"rel_activation", "relative_symbols", "saturated_mask"},
        why={
            "saturated_mask": SATURATED_WHY,
            "rel_activation": "value augmentation is exact only for identity rel_activation",
            "relative_symbols": "value augmentation needs absolute symbols",
        },
    ),
)
def value_augmentation(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    qr: torch.Tensor,  # (B, R, N, dr)
    kr: torch.Tensor,  # (B, R, M, dr)
    v: torch.Tensor | None = None,  # (B, Hkv, M, hd)
    v_rel: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    rel_scale: float | None = None,
    rel_activation: str = "identity",
    dropout_p: float = 0.0,
) -> torch.Tensor:  # (B, H, N, hd + R)
    scale, rel_scale = default_scales(q, qr, scale, rel_scale)
    n_rel, hd = qr.shape[1], v.shape[-1]
    q, k = q.contiguous(), k.contiguous()  # once, not in each of the SDPA calls below
    rel_keys = repeat(kr, "b r m d -> b h m (r d)", h=k.shape[1])
    values = torch.cat([v, rel_keys], dim=-1)  # (B, Hkv, M, hd + R dr)
    dk = q.shape[-1]
    if dropout_p > 0:
        out = sdpa(q, k, values, attn_mask, is_causal, scale, dropout_p)
    else:
        parts = values.split(dk, dim=-1)
        out = torch.cat([sdpa(q, k, part, attn_mask, is_causal, scale) for part in parts], dim=-1)
    sym, attended_keys = out[..., :hd], out[..., hd:]
    attended_keys = rearrange(attended_keys, "b h n (r d) -> b h n r d", r=n_rel)
    rel = einsum(attended_keys, qr, "b h n r d, b r n d -> b h n r") * rel_scale
    return torch.cat([sym, rel], dim=-1)
