"""Sliding-window attention: an example of a mechanism of your own, as a plugin.

Each query attends to itself and the `window - 1` positions before it (causal) or around it
(non-causal: |i - j| < window), on top of the caller's mask (boolean, or additive float):

    A^h = softmax(Q^h K^h^T / sqrt(head_dim) + mask + band) V^h,
    band_ij = 0 if |i - j| < window (and j <= i causally), else -inf

It reuses standard attention's projections and hands the softmax kernel family the band as a
mask (boolean, or the caller's float mask with -inf outside the band), so every softmax
backend that takes a mask serves it and `backend="auto"` picks one by capability. Import this
file (a grid's ``imports = ["sliding_window.py"]``, ``attn-zoo ... --import
examples/sliding_window.py``, or a plain import) and ``sliding_window`` is a mechanism like
any other: ``attn_zoo.build("sliding_window", d_model=64, n_heads=4, window=8)``, in every
model, in grids with any number of workers and on Ray.
"""

from __future__ import annotations

import torch
from einops import rearrange

import attn_zoo as az
from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.mechanisms.standard import StandardAttention


def band(n: int, m: int, window: int, causal: bool, device: torch.device) -> torch.Tensor:
    """(N, M) bool, True where query i may see key j: |i - j| < window (j <= i if causal),
    aligned bottom-right when N != M (the last query is the last key's position)."""
    i = torch.arange(n, device=device)[:, None] + (m - n)
    j = torch.arange(m, device=device)[None, :]
    near = (i - j).abs() < window
    return near & (j <= i) if causal else near


@az.register_mechanism("sliding_window")
class SlidingWindowAttention(StandardAttention):
    supports_cache = False  # the band needs absolute positions; no KV cache here

    def __init__(self, d_model: int, n_heads: int, window: int = 8, **kwargs):
        # kwargs: StandardAttention's (n_kv_heads, dropout, ...), handed on whole; built by
        # name, a kwarg that neither __init__ takes is a ValueError naming the closest one.
        # Refuse those of the base that this forward (its own) would ignore: the mods.
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window={window!r}: must be an integer >= 1")
        for name in ("score_mod", "mask_mod"):
            if kwargs.get(name) is not None:
                raise ValueError(f"{name}: sliding_window attention takes no mods (its band is "
                                 "its mask); standard attention applies them")  # fmt: skip
        super().__init__(d_model, n_heads, **kwargs)
        self.window = window

    def forward(self, x, symbols=None, attn_mask=None, is_causal=False, rope=None, context=None,
                cache=None):  # fmt: skip
        if cache is not None or context is not None:
            raise ValueError("sliding_window attention is self-attention without a KV cache")
        q, k = self.queries_keys(x, x, rope)
        v = rearrange(self.wv(x), "b n (h d) -> b h n d", h=self.n_kv_heads)
        mask = band(x.shape[1], x.shape[1], self.window, bool(is_causal), x.device)
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # the caller's mask too
            mask = mask & attn_mask
        elif attn_mask is not None:  # additive float: its biases kept, -inf outside the band
            mask = torch.where(mask, attn_mask, -torch.inf)
        out = softmax_attention(
            q, k, v, attn_mask=mask, scale=self.head_dim**-0.5,
            dropout_p=self.dropout if self.training else 0.0, backend=self.backend,
        )  # fmt: skip
        return self.resid_dropout(self.wo(rearrange(out, "b h n d -> b n (h d)")))
