"""Attention problems: a frozen description of one kernel call, turned into tensors on demand.

A problem is drawn by Hypothesis (`strategies.attention_problems`) and shrinks to a readable
repr; `inputs(dtype)` rebuilds the same tensors from its seed every time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK_KINDS = ("none", "random", "key_padding", "empty_rows")


@dataclass(frozen=True)
class AttentionProblem:
    """q (batch, heads, q_len, key_dim), k (batch, kv_heads, k_len, key_dim),
    v (batch, kv_heads, k_len, value_dim), a mask of kind `mask` (see `MASK_KINDS`)."""

    batch: int = 1
    heads: int = 2
    kv_heads: int = 2
    q_len: int = 8
    k_len: int = 8
    key_dim: int = 4
    value_dim: int = 4
    mask: str = "none"
    is_causal: bool = False
    scale: float | None = None
    dtype: torch.dtype = torch.float32
    seed: int = 0

    def __post_init__(self):
        if self.mask not in MASK_KINDS:
            raise ValueError(f"mask={self.mask!r}: valid kinds are {MASK_KINDS}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")

    def attn_mask(self, gen: torch.Generator) -> torch.Tensor | None:
        """Boolean mask broadcastable to (batch, heads, q_len, k_len), or None."""
        b, h, n, m = self.batch, self.heads, self.q_len, self.k_len
        if self.mask == "none":
            return None
        if self.mask == "key_padding":  # (B, 1, 1, M): each sequence keeps a random prefix
            keep = torch.randint(0, m + 1, (b, 1, 1, 1), generator=gen)
            return torch.arange(m).view(1, 1, 1, m) < keep
        mask = torch.rand(b, h, n, m, generator=gen) < 0.7
        if self.mask == "empty_rows":  # about a third of the query rows see no key at all
            mask &= torch.rand(b, h, n, 1, generator=gen) < 0.67
        return mask

    def inputs(self, dtype: torch.dtype | None = None, device: str = "cpu") -> dict:
        """Kernel kwargs: q, k, v (leaf tensors requiring grad), attn_mask, is_causal, scale."""
        gen = torch.Generator().manual_seed(self.seed)
        shapes = {
            "q": (self.batch, self.heads, self.q_len, self.key_dim),
            "k": (self.batch, self.kv_heads, self.k_len, self.key_dim),
            "v": (self.batch, self.kv_heads, self.k_len, self.value_dim),
        }
        tensors = {
            name: torch.randn(s, generator=gen, dtype=torch.float64) for name, s in shapes.items()
        }
        mask = self.attn_mask(gen)
        dtype = self.dtype if dtype is None else dtype
        inputs = {name: t.to(dtype).to(device).requires_grad_(True) for name, t in tensors.items()}
        inputs["attn_mask"] = None if mask is None else mask.to(device)
        inputs["is_causal"] = self.is_causal
        inputs["scale"] = self.scale
        return inputs
