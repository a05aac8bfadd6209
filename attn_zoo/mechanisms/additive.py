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
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn

from attn_zoo.kernels.additive import additive_attention
from attn_zoo.kernels.rotary import Rotary
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads


@register_mechanism("additive")
class AdditiveAttention(AttentionMechanism):
    """Fastformer additive attention; head_dim = d_model // n_heads."""

    kernel_family = "additive"

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
        u = additive_attention(
            q,
            k,
            v,
            self.query_score,
            self.key_score,
            attn_mask=attn_mask,
            is_causal=is_causal,
            scale=self.head_dim**-0.5,
            backend=self.backend,
        )  # (B, H, N, head_dim)
        return self.wo(self.wr(rearrange(u, "b h n d -> b n (h d)")) + queries)
