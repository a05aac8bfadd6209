"""Differential attention (Ye et al., "Differential Transformer", ICLR 2025, arXiv 2410.05258).

Each head h computes two softmax maps from two halves of its query and key (width d each) and
subtracts them, cancelling the attention both give to irrelevant context:

    [Q1 Q2] = x Wq,  [K1 K2] = x Wk,  V = x Wv        (per head: Qi, Ki (N, d); V (N, 2d))
    A^h = (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) V
    out = concat_h((1 - lambda_init) RMSNorm(A^h)) Wo

with one learnable lambda per layer, re-parameterised as

    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
    lambda_init = 0.8 - 0.6 exp(-0.3 (layer - 1))          (layer: 1-based depth)

lq1, lk1, lq2, lk2 (d,) drawn from N(0, 0.1^2), and RMSNorm (eps 1e-5, one learned weight of
width 2d shared by the heads) normalising each head on its own (the paper's GroupNorm). As in
the official code (microsoft/unilm, Diff-Transformer/multihead_diffattn.py), which this module
follows and is tested against (a transcription: the repository is no installable package;
the PyPI package `differential-transformer` is an unrelated, unfaithful rewrite): n_heads is
half a standard layer's heads (d = d_model / (2 n_heads)), projections have no bias, heads 2h
and 2h+1 of the query and key projections are head h's two halves, and grouped-query heads
(n_kv_heads) map query head j to key head j // (n_heads / n_kv_heads). Models build their
blocks with `layer` set to each block's depth (attn_zoo/models/common.py).

Both maps come from one call of the softmax kernel family over 2 n_heads heads (the values
repeated for the two halves), so every softmax backend serves it: naive, chunked (O(N)
memory), sdpa, flex, xformers; masks, causality (bottom-right too) and RoPE as in standard
attention. Cached decoding (`cache`): the keys (after RoPE) and values of the positions seen,
as standard attention keeps them.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange, repeat
from torch import nn

from attn_zoo.kernels.rotary import Rotary
from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.kernels.softmax.family import check_inputs
from attn_zoo.kernels.softmax.naive import attention_weights
from attn_zoo.mechanisms.base import AttentionMechanism, check_int
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads


def lambda_init(layer: int) -> float:
    """The paper's lambda_init = 0.8 - 0.6 exp(-0.3 (layer - 1)) for the 1-based `layer`."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


@register_mechanism("differential")
class DifferentialAttention(AttentionMechanism):
    """Multi-head differential attention; head width d = d_model // (2 n_heads)."""

    kernel_family = "softmax"
    supports_cache = True  # self-attention: k, v
    model_heads_per_head = 2  # a head's two maps are two of a standard layer's heads

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        layer: int = 1,
        backend: str = "auto",
    ):
        check_heads(d_model, n_heads, n_kv_heads, None)
        check_int("layer", layer)
        if d_model % (2 * n_heads):
            raise ValueError(
                f"d_model={d_model} must be divisible by 2 * n_heads = {2 * n_heads}: each head "
                "splits its query and key into two halves"
            )
        super().__init__(backend)
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.head_dim = d_model // (2 * n_heads)  # d: the width of each half
        self.key_dim = self.head_dim  # what RoPE rotates
        self.layer, self.lambda_init = layer, lambda_init(layer)
        d = self.head_dim
        self.wq = nn.Linear(d_model, 2 * n_heads * d, bias=False)
        self.wk = nn.Linear(d_model, 2 * self.n_kv_heads * d, bias=False)
        self.wv = nn.Linear(d_model, self.n_kv_heads * 2 * d, bias=False)
        self.wo = nn.Linear(n_heads * 2 * d, d_model, bias=False)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(d) * 0.1) for _ in range(4)
        )
        self.norm = nn.RMSNorm(2 * d, eps=1e-5)

    def lambda_full(self) -> torch.Tensor:
        """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init (a scalar tensor)."""
        first = torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
        return first - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols: torch.Tensor | None = None,  # must be None: differential attention reads none
        attn_mask: torch.Tensor | None = None,  # bool or float, broadcastable to (B, H, N, N)
        is_causal: bool | str = False,
        rope: Rotary | None = None,  # RoPE on queries and keys
        cache: LayerCache | None = None,  # cached decoding: k, v of the positions before x
    ) -> torch.Tensor:  # (B, N, d_model)
        if symbols is not None:
            raise ValueError("differential attention reads no symbols: pass symbols=None")
        q, k = self.queries_keys(x, rope)
        v = rearrange(self.wv(x), "b n (h e) -> b h n e", h=self.n_kv_heads)  # (B, Hkv, N, 2d)
        if cache is not None:
            k, v = cache.append(k=k, v=v)
            cache.advance(x.shape[1])
        both = softmax_attention(
            q,
            k,
            both_halves(v),
            attn_mask=split_heads(attn_mask),
            is_causal=is_causal,
            scale=self.head_dim**-0.5,
            backend=self.backend,
        )  # (B, 2H, N, 2d)
        both = rearrange(both, "b (h two) n e -> b h two n e", two=2)
        heads = both[:, :, 0] - self.lambda_full().to(both.dtype) * both[:, :, 1]
        heads = self.norm(heads) * (1 - self.lambda_init)
        return self.wo(rearrange(heads, "b h n e -> b n (h e)"))

    def queries_keys(self, x: torch.Tensor, rope: Rotary | None) -> tuple[torch.Tensor, ...]:
        """q (B, 2H, N, d) and k (B, 2Hkv, N, d), heads 2h and 2h + 1 the halves of head h,
        with RoPE if given."""
        q = rearrange(self.wq(x), "b n (h d) -> b h n d", d=self.head_dim)
        k = rearrange(self.wk(x), "b n (h d) -> b h n d", d=self.head_dim)
        if rope is not None:
            q, k = rope.apply(q), rope.apply(k)
        return q, k

    @torch.no_grad()
    def attention_maps(
        self,
        x: torch.Tensor,
        symbols: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool | str = False,
        rope: Rotary | None = None,
        cache: LayerCache | None = None,
    ) -> dict[str, torch.Tensor]:
        """The forward pass's differential maps, materialised: {"attention": (B, H, N, N),
        softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d)) per head}; the call
        checked as the forward's kernel call is (the softmax family's check_inputs)."""
        if cache is not None:
            raise ValueError("attention maps are recorded from uncached calls only (cache=None)")
        q, k = self.queries_keys(x, rope)
        v = both_halves(rearrange(self.wv(x), "b n (h e) -> b h n e", h=self.n_kv_heads))
        call = check_inputs(q, k, v, split_heads(attn_mask), is_causal, self.head_dim**-0.5)
        maps = attention_weights(q, k, call["attn_mask"], call["is_causal"], call["scale"])
        maps = rearrange(maps, "b (h two) n m -> b h two n m", two=2)
        return {"attention": maps[:, :, 0] - self.lambda_full().to(maps.dtype) * maps[:, :, 1]}


def both_halves(v: torch.Tensor) -> torch.Tensor:
    """Values (B, Hkv, M, 2d) as those of the 2 Hkv half-heads (B, 2 Hkv, M, 2d): head h's for
    2h and 2h + 1, the two maps of each head averaging the same values."""
    return repeat(v, "b h m e -> b (h two) m e", two=2)


def split_heads(attn_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A mask over the H heads as one over the 2H half-heads (head h's mask for 2h, 2h + 1)."""
    if attn_mask is None or attn_mask.dim() < 3 or attn_mask.shape[-3] == 1:
        return attn_mask
    return attn_mask.repeat_interleave(2, dim=-3)
