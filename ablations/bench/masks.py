"""The masks suite's kernel: softmax attention under a local mask, as a mask mod (sdpa and
chunked: their block mask skips the empty tiles) or as a dense (N, N) boolean mask (sdpa), on
q, k and v cut from one input so that `measure` runs it as a module (a fresh process rebuilds
it by name to measure memory).

Masks (`MASKS`, of width w = the suite's window):

    window           causal sliding window of w keys               visible: N w
    document         documents of 3 w tokens, each seeing itself    visible: 3 N w
    prefix_lm        prefix of w keys, causal after it              visible: N^2 / 2 + N w
    document_causal  and_masks(document, causal): packed causal LM  visible: 3 N w / 2
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from einops import rearrange
from torch import nn

from attn_zoo.kernels.softmax import and_masks, block_mask, softmax_attention
from attn_zoo.kernels.softmax.blocks import EMPTY
from attn_zoo.kernels.softmax.chunked import BLOCK
from attn_zoo.kernels.softmax.mods import (
    MaskMod,
    causal,
    document,
    mask_from_mod,
    prefix_lm,
    sliding_window,
)


def documents(n: int, length: int) -> MaskMod:
    """Documents of `length` tokens packed into `n` (the last one cut)."""
    return document([length] * -(-n // length))


MASKS: dict[str, Callable[[int, int], MaskMod]] = {  # name -> (N, w) -> the mask mod
    "window": lambda n, w: sliding_window(w),
    "document": lambda n, w: documents(n, 3 * w),
    "prefix_lm": lambda n, w: prefix_lm(w),
    "document_causal": lambda n, w: and_masks(documents(n, 3 * w), causal()),
}


def kept_tiles(mask: str, n: int, window: int, block: int = BLOCK) -> float:
    """The fraction of the (`block` x `block`) tiles that `mask` at N = n leaves non-empty."""
    classes = block_mask(MASKS[mask](n, window), 1, 1, n, n, block, "cpu")
    return float((classes != EMPTY).float().mean())


class MaskedKernel(nn.Module):
    """softmax_attention on `backend` under the mask `mask` (`MASKS`) of width `window`: as a
    mask mod built anew for every call (as a mechanism's mods are: the block mask comes from
    the block masks' cache), or `dense`: as its (N, N) boolean mask, built at the first call at each
    N (the warm-up, not timed) and kept. Input x (1, N, d_model = 3 heads head_dim) holds q, k
    and v; output (1, heads, N, head_dim)."""

    def __init__(self, d_model: int, heads: int, mask: str, window: int, dense: bool, backend: str):
        super().__init__()
        if mask not in MASKS:
            raise ValueError(f"mask={mask!r}: valid are {', '.join(MASKS)}")
        self.heads, self.mask, self.window, self.dense, self.backend = (
            heads, mask, window, dense, backend
        )  # fmt: skip
        self.masks: dict[int, torch.Tensor] = {}

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        n = x.shape[1]
        q, k, v = rearrange(x, "b n (three h d) -> three b h n d", three=3, h=self.heads)
        mod = MASKS[self.mask](n, self.window)
        if not self.dense:
            return softmax_attention(
                q, k, v, is_causal=is_causal, backend=self.backend, mask_mod=mod
            )
        if n not in self.masks:
            self.masks[n] = mask_from_mod(mod, 1, 1, n, n, x.device)[0, 0].contiguous()
        return softmax_attention(
            q, k, v, attn_mask=self.masks[n], is_causal=is_causal, backend=self.backend
        )
