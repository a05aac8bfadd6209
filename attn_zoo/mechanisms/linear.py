"""Linear attention (Katharopoulos et al., "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention", ICML 2020, arXiv 2006.16236).

Per head h, with the positive feature map phi(x) = elu(x) + 1 in place of the softmax kernel:

    Q = x Wq,  K = x Wk,  V = x Wv         (Q^h, K^h (N, key_dim); V^h (N, head_dim))
    A^h_i = sum_j <phi(q_i), phi(k_j)> v_j / sum_j <phi(q_i), phi(k_j)>
          = phi(q_i)^T S / phi(q_i)^T z,   S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)
    out = concat_h(A^h) Wo

Causal (is_causal=True) the sums run over j <= i, a running state (S_i, z_i): an RNN with
O(1) memory per step. Backends (kernel family ``linear``): ``naive`` (quadratic, any mask),
``chunked`` (chunkwise recurrent, O(N); masks must not depend on the query, e.g. padding of
shape (B, 1, 1, N)); ``auto`` picks chunked when it fits. A query with no allowed key gives
zeros. Grouped-query heads (n_kv_heads) share key/value heads as in standard attention.

Cached decoding (`cache`, a `LayerCache`, causal only, no attn_mask): the cache is the
recurrent state (S, z) of the kv heads, S (B, Hkv, key_dim, head_dim), z (B, Hkv, key_dim),
O(1) per layer whatever the length. The first call (the prompt) runs the kernel and sums its
keys into the state; later calls take their new positions' outputs from the state and, among
themselves, the causal quadratic form (the chunked backend's step), then add their keys.
"""

from __future__ import annotations

import torch
from einops import einsum, rearrange
from torch import nn

from attn_zoo.kernels.heads import group_queries
from attn_zoo.kernels.linear import elu_feature_map, linear_attention
from attn_zoo.kernels.linear.naive import normalise
from attn_zoo.kernels.rotary import Rotary
from attn_zoo.kernels.softmax.masks import causal_alignment, causal_mask
from attn_zoo.kernels.softmax.naive import upcast_half
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads


def check_cached_call(name: str, attn_mask, is_causal) -> None:
    """A recurrent cache serves causal calls without a mask only."""
    if attn_mask is not None or causal_alignment(is_causal) is None:
        raise ValueError(
            f"{name} attention with a cache (its recurrent state) serves causal calls without an "
            f"attn_mask only, got is_causal={is_causal!r}, attn_mask "
            f"{'given' if attn_mask is not None else 'None'}"
        )


@register_mechanism("linear")
class LinearAttention(AttentionMechanism):
    """Multi-head linear attention; head_dim = d_model // n_heads, key_dim defaults to it."""

    kernel_family = "linear"
    supports_cache = True  # the recurrent state (S, z)

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        key_dim: int | None = None,
        n_kv_heads: int | None = None,
        bias: bool = True,
        backend: str = "auto",
    ):
        check_heads(d_model, n_heads, n_kv_heads, None)
        super().__init__(backend)
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.head_dim = d_model // n_heads
        self.key_dim = self.head_dim if key_dim is None else key_dim
        if self.key_dim < 1:
            raise ValueError(f"key_dim={key_dim}: must be >= 1")
        self.wq = nn.Linear(d_model, n_heads * self.key_dim, bias=bias)
        self.wk = nn.Linear(d_model, self.n_kv_heads * self.key_dim, bias=bias)
        self.wv = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols: torch.Tensor | None = None,  # must be None: linear attention reads no symbols
        attn_mask: torch.Tensor | None = None,  # bool, broadcastable to (B, H, N, N)
        is_causal: bool = False,
        rope: Rotary | None = None,  # must be None (accepted for the block's uniform call)
        cache: LayerCache | None = None,  # cached decoding: the state (S, z) of the positions
    ) -> torch.Tensor:  # (B, N, d_model)
        if rope is not None:
            raise ValueError(
                "linear attention does not support rope: rotating phi(q), phi(k) would break its "
                "positive normaliser (RoFormer's variant is not implemented); pass rope=None and "
                "use learned or sinusoidal positions"
            )
        if symbols is not None:
            raise ValueError("linear attention reads no symbols: pass symbols=None")
        q = rearrange(self.wq(x), "b n (h d) -> b h n d", h=self.n_heads)
        k = rearrange(self.wk(x), "b n (h d) -> b h n d", h=self.n_kv_heads)
        v = rearrange(self.wv(x), "b n (h d) -> b h n d", h=self.n_kv_heads)
        if cache is None:
            out = linear_attention(q, k, v, attn_mask, is_causal, backend=self.backend)
        else:
            check_cached_call("linear", attn_mask, is_causal)
            out = self.recurrent(q, k, v, cache)
        return self.wo(rearrange(out, "b h n d -> b n (h d)"))

    def recurrent(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerCache
    ) -> torch.Tensor:  # (B, H, N, head_dim)
        """Causal outputs of the new positions given the cached state, the state updated."""
        dtype = q.dtype
        if cache.length == 0:  # the prompt: the kernel, as without a cache
            out = linear_attention(q, k, v, is_causal=True, backend=self.backend)
        q, k, v = (upcast_half(t) for t in (q, k, v))
        phi_k = elu_feature_map(k)  # (B, Hkv, N, dk)
        if cache.length:
            phi_q = group_queries(elu_feature_map(q), self.n_kv_heads)  # (B, Hkv, G, N, dk)
            s, z = cache.state["S"], cache.state["z"]
            scores = einsum(phi_q, phi_k, "b h g n d, b h m d -> b h g n m")
            scores = scores.masked_fill(~causal_mask(q.shape[2], q.shape[2], q.device), 0.0)
            numerator = einsum(phi_q, s, "b h g n d, b h d e -> b h g n e") + einsum(
                scores, v, "b h g n m, b h m e -> b h g n e"
            )
            denominator = einsum(phi_q, z, "b h g n d, b h d -> b h g n") + scores.sum(-1)
            out = rearrange(normalise(numerator, denominator), "b h g n e -> b (h g) n e")
        s_new = einsum(phi_k, v, "b h m d, b h m e -> b h d e")
        z_new = phi_k.sum(dim=2)
        if cache.length:
            s_new, z_new = s_new + cache.state["S"], z_new + cache.state["z"]
        cache.state.update(S=s_new, z=z_new)
        cache.advance(q.shape[2])
        return out.to(dtype)
