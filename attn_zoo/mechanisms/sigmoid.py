"""Sigmoid attention (Ramapuram et al., "Theory, Analysis, and Best Practices for Sigmoid
Self-Attention", ICLR 2025, arXiv 2409.04431).

Per head h, each weight is its own sigmoid instead of a row's softmax, with a bias b:

    Q = x Wq,  K = x Wk,  V = x Wv            (per head: Q^h, K^h (N, d); V^h (N, d))
    A^h = sigmoid(Q^h K^h^T / sqrt(d) + b) V^h,     out = concat_h(A^h) Wo

b = -log(n) by default, the paper's (n the sequence length), which keeps the summed weights
of a row near those of softmax at initialisation; or a fixed number (`bias`). A masked key
contributes 0 (its weight is sigmoid(-inf)), so a row with no allowed key gives zeros. n, by
the call's mask (`papers_bias`):

- no mask, or a mask per query (query dim N, e.g. (B, 1, N, N)): n = N, the keys of the call,
  whatever the mask hides (a per-query mask does not say which keys are padding);
- a key mask (query dim 1: (B, 1, 1, N), per head (B, H, 1, N), or (N,)), as swapped
  attention passes its key padding (attn_zoo/interop/surgery.py): n = the keys it keeps
  (True, or an additive value other than -inf) in each batch entry and head, so a padded
  sequence gets the outputs it gets alone, padded on the left or on the right.

With N = 1 a mask is both, and both give n = 1 (b = -log(n) takes no cache, so the keys are
the N queries). The paper's other stabilisers (hybrid norm, LayerScale) are the
model's business and not part of this layer. References: the authors' FlashSigmoid has
no installable package, so the tests check a direct transcription of the equations above
and, where installed, the pure-torch reference of the third-party `triton-sigmoid` package.

Backends (kernel family ``sigmoid``, attn_zoo/kernels/sigmoid/): ``naive`` (materialised) and
``chunked`` (tiles of keys accumulated, O(N) memory, any mask). RoPE on queries and keys;
grouped-query heads (n_kv_heads) as in standard attention.

Cached decoding (`cache`) keeps the keys (after RoPE) and values as standard attention does,
and needs a fixed `bias`: with b = -log(n), every earlier position's output changes as n
grows, so the cache cannot give the uncached outputs (`supports_cache` is False, and a model
then generates by recomputing; e.g. bias = -log(max_block_size) serves both).
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn

from attn_zoo.kernels.rotary import Rotary
from attn_zoo.kernels.sigmoid import sigmoid_attention
from attn_zoo.kernels.softmax.family import check_mask
from attn_zoo.kernels.softmax.masks import as_boolean, is_additive
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads


def papers_bias(
    attn_mask: torch.Tensor | None,  # None, or 4-D (B?, H?, N?, M), bool or additive float
    m: int,  # the keys of the call
    dtype: torch.dtype,  # the queries'; the bias is float32 or wider
) -> tuple[torch.Tensor | None, float]:
    """The paper's b = -log(n) (module docstring) as the call's (attn_mask, bias): without a
    mask or with one per query, n = m and b the float bias, the mask as given; with a key
    mask (query dim 1), n_bh = the keys it keeps per batch entry and head (at least 1), so
    b differs per row: it is folded into the mask, (B?, H?, 1, M) additive,
    mask_bhj = -log(n_bh) where key j is kept (plus the mask's own value if additive), -inf
    where hidden, and the bias is 0."""
    if attn_mask is None or attn_mask.shape[-2] != 1:
        return attn_mask, -math.log(max(m, 1))
    kept = as_boolean(attn_mask)
    n = kept.sum(dim=-1, keepdim=True).clamp(min=1)  # (B?, H?, 1, 1)
    log_n = n.to(torch.promote_types(dtype, torch.float32)).log()
    if is_additive(attn_mask):
        return attn_mask - log_n, 0.0
    return torch.where(kept, -log_n, float("-inf")), 0.0


@register_mechanism("sigmoid")
class SigmoidAttention(AttentionMechanism):
    """Multi-head sigmoid attention; head_dim = d_model // n_heads."""

    kernel_family = "sigmoid"

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        bias: float | None = None,
        n_kv_heads: int | None = None,
        backend: str = "auto",
    ):
        check_heads(d_model, n_heads, n_kv_heads, None)
        finite = isinstance(bias, int | float) and not isinstance(bias, bool)
        if bias is not None and not (finite and math.isfinite(bias)):
            raise ValueError(
                f"bias={bias!r}: must be None (b = -log(n), n the keys of each call) or a "
                "finite number"
            )
        super().__init__(backend)
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.head_dim = self.key_dim = d_model // n_heads
        self.bias = bias
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    @property
    def supports_cache(self) -> bool:
        """Only a fixed bias gives cached outputs equal to the uncached ones (module doc)."""
        return self.bias is not None

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols: torch.Tensor | None = None,  # must be None: sigmoid attention reads no symbols
        attn_mask: torch.Tensor | None = None,  # bool or float, broadcastable to (B, H, N, N)
        is_causal: bool | str = False,
        rope: Rotary | None = None,  # RoPE on queries and keys
        cache: LayerCache | None = None,  # cached decoding (fixed bias): k, v of the positions
    ) -> torch.Tensor:  # (B, N, d_model)
        if symbols is not None:
            raise ValueError("sigmoid attention reads no symbols: pass symbols=None")
        if cache is not None and self.bias is None:
            raise ValueError(
                "sigmoid attention with bias=None (b = -log(n)) takes no cache: its b changes "
                "with every new position; build it with a fixed bias, e.g. "
                "bias=-math.log(max_block_size)"
            )
        q = rearrange(self.wq(x), "b n (h d) -> b h n d", h=self.n_heads)
        k = rearrange(self.wk(x), "b n (h d) -> b h n d", h=self.n_kv_heads)
        v = rearrange(self.wv(x), "b n (h d) -> b h n d", h=self.n_kv_heads)
        if rope is not None:
            q, k = rope.apply(q), rope.apply(k)
        if cache is not None:
            k, v = cache.append(k=k, v=v)
            cache.advance(x.shape[1])
        bias = self.bias
        if bias is None:
            attn_mask, bias = papers_bias(check_mask(attn_mask, q, k), k.shape[2], q.dtype)
        out = sigmoid_attention(
            q, k, v, attn_mask, is_causal, scale=self.head_dim**-0.5, bias=bias,
            backend=self.backend,
        )  # fmt: skip
        return self.wo(rearrange(out, "b h n d -> b n (h d)"))
