"""Normalisation layers by name: layernorm, rmsnorm, none."""

from __future__ import annotations

import torch
from torch import nn

from attn_zoo.registry import Registry

NORMS: Registry = Registry("norm_type")


@NORMS.register("rmsnorm")
class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019).

    As in the `dual-attention` reference (and LLaMA), the normalisation is computed in float32
    and cast back before the weight multiplies, also for float64 inputs.
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(
            x
        ) * self.weight


@NORMS.register("layernorm")
def layer_norm(dim: int) -> nn.Module:
    """torch's LayerNorm (with bias) over the last `dim` features."""
    return nn.LayerNorm(dim)


@NORMS.register("none")
def no_norm(dim: int) -> nn.Module:
    """The identity."""
    return nn.Identity()


def create_norm(dim: int, norm_type: str) -> nn.Module:
    """The norm named `norm_type` over the last `dim` features."""
    return NORMS[norm_type](dim)
