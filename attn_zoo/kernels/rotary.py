"""Rotary position embeddings (RoPE, Su et al. 2021) on attention queries and keys.

For position t and pair i of a width-d vector, with inv_freq_i = theta^(-2i/d):

    (x_a, x_b) -> (x_a cos(t inv_freq_i) - x_b sin(..),  x_a sin(..) + x_b cos(..))

`interleaved=True` pairs (x[2i], x[2i+1]) as the `dual-attention` reference and LLaMA do;
`interleaved=False` pairs (x[i], x[i + d/2]) (the GPT-NeoX "rotate half" form).
As in the reference, the tables are computed in float32 and the rotation reads its input
rounded to float32 (so a float64 model matches the reference to 1e-10).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange


def rotary_tables(dim: int, length: int, theta: float = 10000.0, device=None):
    """(cos, sin), each (length, dim // 2) float32."""
    if dim % 2:
        raise ValueError(f"RoPE needs an even width, got dim={dim}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(length, device=device), inv_freq).float()
    return torch.cos(angles), torch.sin(angles)


@dataclass(frozen=True)
class Rotary:
    """RoPE tables for one call: cos and sin (N, d/2), applied to (B, H, N, d) tensors."""

    cos: torch.Tensor
    sin: torch.Tensor
    interleaved: bool = True

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        n, half = x.shape[-2], x.shape[-1] // 2
        if self.cos.shape != (n, half):
            raise ValueError(
                f"RoPE tables {tuple(self.cos.shape)} do not fit length {n} and width {x.shape[-1]}"
                f" (need ({n}, {half}))"
            )
        pattern = "... (d two) -> two ... d" if self.interleaved else "... (two d) -> two ... d"
        a, b = rearrange(x.float(), pattern, two=2)
        rotated = torch.stack([a * self.cos - b * self.sin, a * self.sin + b * self.cos])
        back = "two ... d -> ... (d two)" if self.interleaved else "two ... d -> ... (two d)"
        return rearrange(rotated, back).type_as(x)
