"""Additive attention (Fastformer) by prefix scans: O(N) time and memory.

Both poolings of the naive form (see naive.py) are softmax-weighted prefix sums

    g_t = sum_{i <= t} e^(a_i - m_t) x_i / sum_{i <= t} e^(a_i - m_t),    m_t = max_{i <= t} a_i

and subtracting the running max m_t keeps every exponent <= 0, so no prefix overflows and none
underflows to 0/0 however far apart the scores are (a single cumsum of e^(a_i - c) for one
constant c cannot promise both). The scan runs in blocks of `block` positions:

1. inside each block, every position's state (m, l = sum e^(a_i - m), acc = sum e^(a_i - m) x_i)
   over the block's positions up to it, all blocks at once (work O(N block d));
2. a scan over the N / block block totals gives the state entering each block, combined by
   the online-softmax rule  m = max(m1, m2),  l = l1 e^(m1 - m) + l2 e^(m2 - m)  (acc likewise);
3. each position's state is combined with the state entering its block; g_t = acc_t / l_t.

Without is_causal both poolings are one softmax over all positions. Masks: those that do not
depend on the query (shape (B, H, 1, N), e.g. padding) set a_i = -inf for masked positions;
masks that differ per query need the naive backend. A row with no allowed key gives zeros.
"""

import torch
import torch.nn.functional as F
from einops import einsum, rearrange

from attn_zoo.kernels.additive.family import FEATURES
from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.softmax.masks import causal_mask
from attn_zoo.kernels.softmax.naive import masked_softmax, upcast_half

BLOCK = 64
NEG_INF = float("-inf")


def finite(m: torch.Tensor) -> torch.Tensor:
    """A running max usable as an exponent offset: -inf (nothing seen yet) becomes 0."""
    return m.masked_fill(m == NEG_INF, 0.0)


def combine(m1, l1, acc1, m2, l2, acc2):
    """Merge two online-softmax states (max, sum, weighted sum) of disjoint position sets."""
    m = torch.maximum(m1, m2)
    r1, r2 = torch.exp(m1 - finite(m)), torch.exp(m2 - finite(m))
    return m, l1 * r1 + l2 * r2, acc1 * r1[..., None] + acc2 * r2[..., None]


def prefix_pool(scores: torch.Tensor, values: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """g_t = sum_{i <= t} softmax_{i <= t}(scores)_i values_i: (B, H, N, d); -inf scores are
    masked positions; rows with nothing allowed give zeros. scores (B, H, N), values (.., d)."""
    n = scores.shape[-1]
    if n == 0:  # no positions: nothing to pool
        return values
    pad = -n % block
    scores = rearrange(F.pad(scores, (0, pad), value=NEG_INF), "b h (c l) -> b h c l", l=block)
    values = rearrange(F.pad(values, (0, 0, 0, pad)), "b h (c l) d -> b h c l d", l=block)
    # 1. states within each block; the offsets are constants of the math, so no gradient
    m_in = scores.detach().cummax(dim=-1).values  # (B, H, C, L) running max inside the block
    exponent = scores[..., None, :] - finite(m_in)[..., None]  # (B, H, C, t, i)
    later = ~causal_mask(block, block, scores.device)  # i > t
    weights = torch.exp(exponent.masked_fill(later, NEG_INF))
    l_in = weights.sum(dim=-1)
    acc_in = einsum(weights, values, "b h c t i, b h c i d -> b h c t d")
    # 2. the state entering each block, scanned over the block totals
    m = torch.full_like(m_in[..., 0, 0], NEG_INF)  # (B, H): nothing seen yet
    l, acc = torch.zeros_like(l_in[..., 0, 0]), torch.zeros_like(acc_in[..., 0, 0, :])
    entering = []
    for c in range(scores.shape[2]):
        entering.append((m, l, acc))
        m, l, acc = combine(m, l, acc, m_in[..., c, -1], l_in[..., c, -1], acc_in[..., c, -1, :])
    m_e, l_e, acc_e = (torch.stack(t, dim=2) for t in zip(*entering, strict=True))
    # 3. every position: the state entering its block merged with its state inside the block
    _, l_t, acc_t = combine(m_e[..., None], l_e[..., None], acc_e[..., None, :], m_in, l_in, acc_in)
    out = acc_t / torch.where(l_t == 0, 1.0, l_t)[..., None]
    return rearrange(out, "b h c l d -> b h (c l) d")[:, :, :n]


def global_pool(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """sum_i softmax_i(scores)_i values_i, the same for every row: (B, H, N, d)."""
    weights = masked_softmax(scores, None)  # -inf scores (masked) get weight 0
    pooled = einsum(weights, values, "b h i, b h i d -> b h d")
    return pooled[:, :, None].expand_as(values)


@register_backend(
    "additive",
    "scan",
    tier="chunked",
    priority=10,
    capabilities=Capabilities(
        FEATURES - {"mask"},
        why={
            "mask": "the scan pools each prefix once for all queries, so it serves only masks "
            "that do not depend on the query (shape (B, H, 1, N), e.g. padding); use 'naive'"
        },
    ),
    block_sizes=(BLOCK,),
)
def scan(
    q: torch.Tensor,  # (B, H, N, d)
    k: torch.Tensor,  # (B, H, N, d)
    v: torch.Tensor,  # (B, H, N, d)
    wq: torch.Tensor,  # (H, d)
    wk: torch.Tensor,  # (H, d)
    attn_mask: torch.Tensor | None = None,  # broadcastable to (B, H, 1, N): keys only
    is_causal: bool = False,
    scale: float | None = None,
    block: int = BLOCK,
) -> torch.Tensor:  # (B, H, N, d)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = q.dtype
    q, k, v, wq, wk = (upcast_half(t) for t in (q, k, v, wq, wk))
    keep = None if attn_mask is None else attn_mask[..., 0, :]  # (B|1, H|1, N)

    def pool(scores, values):
        if keep is not None:
            scores = scores.masked_fill(~keep, NEG_INF)
        return prefix_pool(scores, values, block) if is_causal else global_pool(scores, values)

    global_query = pool(einsum(q, wq, "b h n d, h d -> b h n") * scale, q)
    p = global_query * k
    global_key = pool(einsum(p, wk, "b h n d, h d -> b h n") * scale, p)
    return (global_key * v).to(dtype)
