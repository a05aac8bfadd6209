"""Softmax attention on torch.nn.functional.scaled_dot_product_attention.

Routed around the CPU flash kernel's limits so that it serves every call:
- unequal key / value head widths: q, k and v are zero-padded to one width (zeros change no
  dot product) and the output is cut back;
- a mask together with is_causal: the math path rejects both, so the causal mask is merged in
  (float masks are cast to the inputs' dtype, as SDPA requires);
- rows that see no key are unmasked for the kernel and zeroed after (the contract's zeros).
Grouped kv heads are repeated to the query heads.
"""

import torch
import torch.nn.functional as F

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.softmax.family import FEATURES
from attn_zoo.kernels.softmax.masks import allowed_keys, is_additive, unmask_empty_rows


@register_backend("softmax", "sdpa", tier="fused", priority=30, capabilities=Capabilities(FEATURES))
def sdpa(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:  # (B, H, N, dv)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    dk, dv = q.shape[-1], v.shape[-1]
    width = max(dk, dv)
    if dk != dv:
        q, k = F.pad(q, (0, width - dk)), F.pad(k, (0, width - dk))
        v = F.pad(v, (0, width - dv))
    has_key = None
    if attn_mask is not None:
        mask = allowed_keys(attn_mask, is_causal, q.shape[2], k.shape[2], q.device)
        mask, has_key = unmask_empty_rows(mask)
        if is_additive(mask):
            mask = mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, mask, dropout_p, scale=scale)
    else:
        out = F.scaled_dot_product_attention(q, k, v, None, dropout_p, is_causal, scale=scale)
    out = out[..., :dv]
    return out if has_key is None else out * has_key
