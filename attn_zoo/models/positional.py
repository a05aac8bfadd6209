"""Positional encodings by name: learned, sinusoidal, rope, rope_half, none.

Each is a module with `forward(x, offset=0)` (x (B, N, d) -> x with the positions offset ..
offset + N - 1 added; the identity for rotary encodings) and `rotary(n, offset=0)` (the `Rotary`
tables of those positions, or None). A nonzero offset is a cached decoding call's: its tokens
follow `offset` cached ones.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attn_zoo.kernels.rotary import Rotary, rotary_tables
from attn_zoo.registry import Registry

POSITIONAL: Registry = Registry("positional encoding")


class _Positional(nn.Module):
    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len

    def check(self, n: int, offset: int = 0) -> None:
        if offset + n > self.max_len:
            at = f" at offset {offset}" if offset else ""
            raise ValueError(
                f"sequence length {n}{at} exceeds the positional encoding's max length "
                f"{self.max_len}"
            )

    def rotary(self, n: int, offset: int = 0) -> Rotary | None:
        return None


@POSITIONAL.register("none")
class NoPositions(_Positional):
    """No positional information (the identity)."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__(max_len)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x


@POSITIONAL.register("learned")
class LearnedPositions(_Positional):
    """x + E[position], E (max_len, d) learned."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__(max_len)
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        self.check(x.shape[1], offset)
        return x + self.embedding(torch.arange(offset, offset + x.shape[1], device=x.device))


@POSITIONAL.register("sinusoidal")
class SinusoidalPositions(_Positional):
    """scale * x + pe[position], pe[p, 2i] = sin(p / 10000^(2i/d)), pe[p, 2i+1] = cos(..)
    (Vaswani et al. 2017); scale is sqrt(d) when `scale` (as the reference's Seq2Seq)."""

    def __init__(self, d_model: int, max_len: int, scale: bool = False):
        super().__init__(max_len)
        self.factor = math.sqrt(d_model) if scale else 1.0
        position = torch.arange(max_len)[:, None]
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div)
        pe[:, 1::2] = torch.cos(position * div)[:, : d_model // 2]
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        self.check(x.shape[1], offset)
        return x * self.factor + self.pe[offset : offset + x.shape[1]]


class RotaryPositions(_Positional):
    """RoPE on attention queries and keys of width `rope_dim` (tables: non-persistent buffers,
    computed in float32 as in the reference); `interleaved` pairs (2i, 2i+1), else (i, i+d/2)."""

    def __init__(self, d_model: int, max_len: int, rope_dim: int, interleaved: bool = True):
        super().__init__(max_len)
        self.interleaved = interleaved
        cos, sin = rotary_tables(rope_dim, max_len)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        self.check(x.shape[1], offset)
        return x

    def rotary(self, n: int, offset: int = 0) -> Rotary:
        self.check(n, offset)
        end = offset + n
        return Rotary(self.freqs_cos[offset:end], self.freqs_sin[offset:end], self.interleaved)


@POSITIONAL.register("rope")
def rope(d_model: int, max_len: int, rope_dim: int) -> RotaryPositions:
    """RoPE pairing features (2i, 2i+1), as in the reference."""
    return RotaryPositions(d_model, max_len, rope_dim, interleaved=True)


@POSITIONAL.register("rope_half")
def rope_half(d_model: int, max_len: int, rope_dim: int) -> RotaryPositions:
    """RoPE pairing features (i, i + d/2), as in LLaMA's Hugging Face port."""
    return RotaryPositions(d_model, max_len, rope_dim, interleaved=False)


def build_positional(name: str, d_model: int, max_len: int, **kwargs) -> _Positional:
    """Positional encoding `name`; rotary ones need rope_dim (the attention key width)."""
    return POSITIONAL.build(name, d_model, max_len, **kwargs)
