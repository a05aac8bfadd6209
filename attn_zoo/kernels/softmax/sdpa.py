"""Softmax attention on torch.nn.functional.scaled_dot_product_attention.

Routed around the CPU flash kernel's limits so that it serves every call:
- unequal key / value head widths: q, k and v are zero-padded to one width (zeros change no
  dot product) and the output is cut back;
- a mask together with is_causal: the math path rejects both, so the causal mask is merged in
  (float masks are cast to the inputs' dtype, as SDPA requires; a float mask of a wider dtype
  than the inputs, float32 with float16 ones, runs the call in its dtype instead, as naive's
  scores + mask promotes: the cast would turn float32's min, transformers' masked value, into
  -inf and a row of it into an empty one);
- rows that see no key are unmasked for the kernel and zeroed after (the contract's zeros).
Grouped kv heads are repeated to the query heads.

A mask mod is not materialised into an (N, M) mask: its block mask (blocks.py, derived from
the mod once per mod and shape, cached) gives, per tile of `block` queries, the span of key
tiles it leaves non-empty, from the first to the last (causality cuts it at the diagonal), and
SDPA runs once per query tile on that span, the mod evaluated there only where a tile of the
span is partial. A local mask (a sliding window, documents, their combinations with causality)
then costs O(N visible) time and memory, each query tile at SDPA's own speed; a mod keeping
every tile costs the dense call's work in N / block calls.
"""

import torch
import torch.nn.functional as F

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.softmax.blocks import EMPTY, FULL, block_mask
from attn_zoo.kernels.softmax.family import FEATURES, SATURATED_WHY
from attn_zoo.kernels.softmax.masks import (
    allowed_keys,
    causal_mask,
    is_additive,
    restrict,
    unmask_empty_rows,
)
from attn_zoo.kernels.softmax.mods import MaskMod, apply_mask_mod, mod_indices

BLOCK = 256  # queries (and keys) per tile of a mask mod's block mask


@register_backend(
    "softmax",
    "sdpa",
    tier="fused",
    priority=30,
    capabilities=Capabilities(
        (FEATURES - {"saturated_mask"}) | {"mask_mod"}, why={"saturated_mask": SATURATED_WHY}
    ),
    block_sizes=(BLOCK,),
)
def sdpa(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    mask_mod: MaskMod | None = None,
    block: int = BLOCK,
) -> torch.Tensor:  # (B, H, N, dv)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if mask_mod is None:
        return _dense(q, k, v, attn_mask, is_causal, scale, dropout_p)
    b, heads, n, m = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if attn_mask is not None:  # broadcast dims made explicit (a free view) so tiles slice
        attn_mask = attn_mask.expand(attn_mask.shape[0], attn_mask.shape[1], n, m)
    classes = block_mask(mask_mod, b, heads, n, m, block, q.device).tolist()
    # whole tiles by split and cat, not slices: a slice's gradient is a zero-filled tensor of
    # the whole input, one per tile (O(N^2 / block) time); a split's is gathered once
    q_tiles, k_tiles, v_tiles = (t.split(block, dim=2) for t in (q, k, v))
    outs = [_no_keys(q[..., :0, :], k, v, attn_mask)]  # N = 0: no tile
    for row, qi, i0 in zip(classes, q_tiles[: len(classes)], range(0, n, block), strict=True):
        i1 = i0 + qi.shape[2]
        last = (i1 - 1) // block if is_causal else len(row) - 1  # keys j <= i only
        kept = [j for j, kind in enumerate(row[: last + 1]) if kind != EMPTY]
        if not kept:  # no key for any of these queries: the contract's zeros
            outs.append(_no_keys(qi, k, v, attn_mask))
            continue
        first, last = kept[0], kept[-1]
        j0, j1 = first * block, min(m, (last + 1) * block)
        mask = None if attn_mask is None else attn_mask[..., i0:i1, j0:j1]
        if is_causal and j1 - 1 > i0:  # the diagonal crosses the span
            mask = restrict(mask, causal_mask(i1 - i0, j1 - j0, q.device, offset=i0 - j0))
        if any(kind != FULL for kind in row[first : last + 1]):
            indices = mod_indices(b, heads, (i0, i1), (j0, j1), q.device)
            mask = restrict(mask, apply_mask_mod(mask_mod, indices))
        kj, vj = (torch.cat(tiles[first : last + 1], dim=2) for tiles in (k_tiles, v_tiles))
        outs.append(_dense(qi, kj, vj, mask, False, scale, dropout_p))
    return torch.cat(outs, dim=2)


def _no_keys(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask) -> torch.Tensor:
    """Zeros (B, H, n, dv) for the n queries of `q` that see no key, in the graph of q, k, v
    and a float `attn_mask` (sums over an empty axis), so that the call still has (zero)
    gradients for all of them."""
    zero = q[..., :0].sum(dim=-1, keepdim=True) + k[..., :0].sum() + v[..., :0].sum()
    if is_additive(attn_mask):
        zero = zero + attn_mask[..., :0].sum().to(zero.dtype)
    return zero.expand(*q.shape[:-1], v.shape[-1])


def _dense(q, k, v, attn_mask, is_causal: bool, scale: float, dropout_p: float) -> torch.Tensor:
    """One SDPA call over every key of `k` and `v`, routed around the kernel's limits (module
    docstring)."""
    wide = torch.promote_types(q.dtype, attn_mask.dtype) if is_additive(attn_mask) else q.dtype
    if wide != q.dtype:  # a float mask wider than the inputs (float32 with half ones): in its
        # dtype, as naive's scores + mask is; cast to q's, float32's min would become -inf
        args = (t.to(wide) for t in (q, k, v))
        return _dense(*args, attn_mask, is_causal, scale, dropout_p).to(q.dtype)
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
