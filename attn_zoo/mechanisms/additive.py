"""Additive attention (Wu et al., "Fastformer: Additive Attention Can Be All You Need",
arXiv 2108.09084), with a causal form for language models.

Per head h (head_dim d, scale 1/sqrt(d)), with learned scoring vectors w_q^h, w_k^h (d,):

    q_i, k_i, v_i = x_i Wq, x_i Wk, x_i Wv                        (per head: (d,) each)
    gq = sum_i softmax_i(<w_q, q_i> / sqrt(d)) q_i                global query
    p_i = gq * k_i                                                 (elementwise)
    gk = sum_i softmax_i(<w_k, p_i> / sqrt(d)) p_i                global key
    u_i = gk * v_i
    out_i = Wo (Wr concat_h(u_i) + concat_h(q_i))                  transform, query residual

Linear in N: each pooling is one softmax-weighted sum. Causal (is_causal=True) the global
query and key at position t pool positions <= t only (cumulative softmax pooling), so outputs
never see the future; a boolean attn_mask (True = may attend, broadcastable to (B, H, N, N))
restricts what each row pools in the same way. Backends (kernel family ``additive``):
``naive`` (quadratic, any mask) and ``scan`` (tier ``chunked``, O(N), masks that do not depend
on the query such as padding of shape (B, 1, 1, N)); ``auto`` picks scan when it fits.

Differences from the official code (wuch15/Fastformer), deliberate: the scoring vectors are
per head (the official ``query_att`` / ``key_att`` are Linear(d_model, n_heads), mixing heads
into each score; their bias cancels in the softmax), and values come from their own projection
Wv as in the paper (the official code reuses the queries as values).

Cached decoding (`cache`, a `LayerCache`, causal only, no attn_mask): the causal form pools
prefixes, and a prefix's softmax pooling is an online-softmax state (max m, sum l, weighted
sum acc), so the cache is a recurrent state of O(1) per layer: the query pool's and the key
pool's state per head. Position t's global query needs only the query state after t, its p_t =
gq_t * k_t, and its global key the key state after p_t, so no earlier q, k or v is kept. The
first call (the prompt) runs the kernel and reduces its positions into the states (its global
queries by the scan's prefix pooling); later calls fold their new positions in one at a time.
"""

from __future__ import annotations

import math

import torch
from einops import einsum, rearrange
from torch import nn

from attn_zoo.kernels.additive import additive_attention
from attn_zoo.kernels.additive.scan import combine, prefix_pool
from attn_zoo.kernels.rotary import Rotary
from attn_zoo.kernels.softmax.naive import upcast_half
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.linear import check_cached_call
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads


def pool_state(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The online-softmax state of pooling all positions: (m (B, H), l (B, H), acc (B, H, d))
    for scores (B, H, N) and values (B, H, N, d), N >= 1."""
    m = scores.amax(dim=-1)
    weights = torch.exp(scores - m[..., None])
    return m, weights.sum(dim=-1), einsum(weights, values, "b h n, b h n d -> b h d")


def fold(state: tuple[torch.Tensor, ...], score: torch.Tensor, value: torch.Tensor):
    """`state` with one more position (score (B, H), value (B, H, d)) pooled; returns the new
    state and its pooled value acc / l."""
    m, l, acc = combine(*state, score, torch.ones_like(score), value)
    return (m, l, acc), acc / l[..., None]


@register_mechanism("additive")
class AdditiveAttention(AttentionMechanism):
    """Fastformer additive attention; head_dim = d_model // n_heads."""

    kernel_family = "additive"
    supports_cache = True  # the two pooling states (recurrent)

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, backend: str = "auto"):
        check_heads(d_model, n_heads, None, None)
        super().__init__(backend)
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=bias)
        self.wk = nn.Linear(d_model, d_model, bias=bias)
        self.wv = nn.Linear(d_model, d_model, bias=bias)
        self.query_score = nn.Parameter(torch.empty(n_heads, self.head_dim))  # w_q per head
        self.key_score = nn.Parameter(torch.empty(n_heads, self.head_dim))  # w_k per head
        for w in (self.query_score, self.key_score):  # as nn.Linear(head_dim, 1) would be
            nn.init.uniform_(w, -1 / math.sqrt(self.head_dim), 1 / math.sqrt(self.head_dim))
        self.wr = nn.Linear(d_model, d_model, bias=bias)  # the paper's "transform"
        self.wo = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols: torch.Tensor | None = None,  # must be None: additive attention reads no symbols
        attn_mask: torch.Tensor | None = None,  # bool, broadcastable to (B, H, N, N)
        is_causal: bool = False,
        rope: Rotary | None = None,  # must be None (accepted for the block's uniform call)
        cache: LayerCache | None = None,  # cached decoding: the pooling states of the positions
    ) -> torch.Tensor:  # (B, N, d_model)
        if rope is not None:
            raise ValueError(
                "additive attention does not support rope: it takes no query-key dot products "
                "for RoPE to rotate; pass rope=None and use learned or sinusoidal positions"
            )
        if symbols is not None:
            raise ValueError("additive attention reads no symbols: pass symbols=None")
        queries = self.wq(x)  # (B, N, d_model), also the residual
        q = rearrange(queries, "b n (h d) -> b h n d", h=self.n_heads)
        k = rearrange(self.wk(x), "b n (h d) -> b h n d", h=self.n_heads)
        v = rearrange(self.wv(x), "b n (h d) -> b h n d", h=self.n_heads)
        if cache is not None:
            check_cached_call("additive", attn_mask, is_causal)
            u = self.recurrent(q, k, v, cache)
            return self.wo(self.wr(rearrange(u, "b h n d -> b n (h d)")) + queries)
        u = additive_attention(
            q,
            k,
            v,
            self.query_score.to(q.dtype),  # under autocast q is bfloat16 or float16
            self.key_score.to(q.dtype),
            attn_mask=attn_mask,
            is_causal=is_causal,
            scale=self.head_dim**-0.5,
            backend=self.backend,
        )  # (B, H, N, head_dim)
        return self.wo(self.wr(rearrange(u, "b h n d -> b n (h d)")) + queries)

    def recurrent(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerCache
    ) -> torch.Tensor:  # (B, H, N, head_dim)
        """Causal u of the new positions given the cached pooling states, the states updated."""
        n, dtype, scale = q.shape[2], q.dtype, self.head_dim**-0.5
        wq, wk = self.query_score.to(dtype), self.key_score.to(dtype)
        if n == 0:
            return q
        if cache.length == 0:  # the prompt: the kernel, as without a cache, then the states
            u = additive_attention(
                q, k, v, wq, wk, is_causal=True, scale=scale, backend=self.backend
            )
            q, k, wq, wk = (upcast_half(t) for t in (q, k, wq, wk))
            q_scores = einsum(q, wq, "b h n d, h d -> b h n") * scale
            p = prefix_pool(q_scores, q) * k  # every position's gq_t * k_t
            k_scores = einsum(p, wk, "b h n d, h d -> b h n") * scale
            cache.state.update(query=pool_state(q_scores, q), key=pool_state(k_scores, p))
            cache.advance(n)
            return u
        q, k, v, wq, wk = (upcast_half(t) for t in (q, k, v, wq, wk))
        query_state, key_state = cache.state["query"], cache.state["key"]
        out = []
        for t in range(n):
            q_t = q[:, :, t]
            query_state, global_query = fold(
                query_state, einsum(q_t, wq, "b h d, h d -> b h") * scale, q_t
            )
            p_t = global_query * k[:, :, t]
            key_state, global_key = fold(
                key_state, einsum(p_t, wk, "b h d, h d -> b h") * scale, p_t
            )
            out.append(global_key * v[:, :, t])
        cache.state.update(query=query_state, key=key_state)
        cache.advance(n)
        return torch.stack(out, dim=2).to(dtype)
