"""Softmax attention on xformers' memory_efficient_attention (CUDA only: no CPU kernels).

`xformers_inputs` converts our layout to xformers': (B, H, N, d) -> (B, N, H, d), grouped kv
heads as 5-D (B, M, Hkv, G, d) with the group expanded, and the mask to an additive
bias (0 or -inf, last dim allocated to a multiple of 8 as xformers requires). It is pure torch
and unit-tested on CPU.
"""

import torch
from einops import rearrange, repeat

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.softmax.family import FEATURES, LOW_AND_SINGLE, SATURATED_WHY
from attn_zoo.kernels.softmax.masks import allowed_keys, is_additive, unmask_empty_rows

CAUSAL = "causal"  # stands for xformers.ops.fmha.attn_bias.LowerTriangularMask (top-left)


def xformers_missing() -> str | None:
    try:
        import xformers.ops  # noqa: F401
    except ImportError as err:
        return f"xformers is not installed (pip install 'attn_zoo[xformers]'): {err}"
    return None


def xformers_inputs(q, k, v, attn_mask=None, is_causal=False):
    """(q, k, v, bias, has_key) in xformers layout; bias is None, CAUSAL or a float tensor,
    has_key None or (..., N, 1) bool in our layout (rows that see no key, to be zeroed)."""
    (b, h, n, _), (hkv, m) = q.shape, k.shape[1:3]
    g = h // hkv
    if g == 1:
        q, k, v = (rearrange(t, "b h n d -> b n h d") for t in (q, k, v))
    else:
        q = rearrange(q, "b (h g) n d -> b n h g d", g=g)
        k, v = (repeat(t, "b h m d -> b m h g d", g=g) for t in (k, v))
    if attn_mask is None:
        return q, k, v, (CAUSAL if is_causal else None), None
    mask, has_key = unmask_empty_rows(allowed_keys(attn_mask, is_causal, n, m, q.device))
    padded = -(-m // 8) * 8
    bias = torch.zeros(b, h, n, padded, dtype=q.dtype, device=q.device)[..., :m]
    if is_additive(mask):
        bias.copy_(mask.expand(b, h, n, m))
    else:
        bias.masked_fill_(~mask.expand(b, h, n, m), float("-inf"))
    if g > 1:
        bias = rearrange(bias, "b (h g) n m -> b h g n m", g=g)
    return q, k, v, bias, has_key


def from_xformers_layout(out: torch.Tensor) -> torch.Tensor:
    """xformers output (B, N, H, d) or (B, N, Hkv, G, d) -> (B, H, N, d)."""
    if out.dim() == 4:
        return rearrange(out, "b n h d -> b h n d")
    return rearrange(out, "b n h g d -> b (h g) n d")


@register_backend(
    "softmax",
    "xformers",
    tier="fused",
    priority=25,
    available=xformers_missing,
    capabilities=Capabilities(
        FEATURES - {"saturated_mask"},
        devices=frozenset({"cuda"}),
        dtypes=LOW_AND_SINGLE,
        why={"cpu": "xformers has no CPU kernels", "saturated_mask": SATURATED_WHY},
    ),
)
def xformers(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:  # (B, H, N, dv)
    import xformers.ops as xops

    xq, xk, xv, bias, has_key = xformers_inputs(q, k, v, attn_mask, is_causal)
    if isinstance(bias, str):
        bias = xops.fmha.attn_bias.LowerTriangularMask()
    out = xops.memory_efficient_attention(xq, xk, xv, attn_bias=bias, p=dropout_p, scale=scale)
    out = from_xformers_layout(out)
    return out if has_key is None else out * has_key
