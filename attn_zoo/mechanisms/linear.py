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
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from attn_zoo.kernels.linear import linear_attention
from attn_zoo.kernels.rotary import Rotary
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads


@register_mechanism("linear")
class LinearAttention(AttentionMechanism):
    """Multi-head linear attention; head_dim = d_model // n_heads, key_dim defaults to it."""

    kernel_family = "linear"

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
        out = linear_attention(q, k, v, attn_mask, is_causal, backend=self.backend)
        return self.wo(rearrange(out, "b h n d -> b n (h d)"))
