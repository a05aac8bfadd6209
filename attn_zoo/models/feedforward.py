"""The position-wise feed-forward block.

    relu/gelu/...: linear2(act(linear1 x))          dff defaults to 4 d
    swiglu:        linear2(silu(linear1 x) * linear3 x)   dff defaults to int(8 d / 3)

Names, defaults and parameter keys follow `dual_attention.model_utils.FeedForwardBlock`
(gelu is the tanh approximation there).
"""

from __future__ import annotations

import torch
from torch import nn

from attn_zoo.kernels.relational.activations import REL_ACTIVATIONS
from attn_zoo.registry import unknown_name_error

ACTIVATIONS = {k: v for k, v in REL_ACTIVATIONS.items() if k != "softmax"}
FF_ACTIVATIONS = (*ACTIVATIONS, "swiglu")  # every name FeedForward takes (swiglu is gated)


def default_dff(d_model: int, activation: str) -> int:
    """The feed-forward width when none is given: 4 d_model, int(8 d_model / 3) for swiglu."""
    return int(2 / 3 * 4 * d_model) if activation == "swiglu" else 4 * d_model


class FeedForward(nn.Module):
    def __init__(
        self, d_model: int, dff: int | None = None, activation: str = "relu", use_bias: bool = False
    ):
        super().__init__()
        if activation not in FF_ACTIVATIONS:
            raise unknown_name_error("activation", activation, list(FF_ACTIVATIONS))
        self.activation = activation
        if dff is None:
            dff = default_dff(d_model, activation)
        self.linear1 = nn.Linear(d_model, dff, bias=use_bias)
        self.linear2 = nn.Linear(dff, d_model, bias=use_bias)
        if activation == "swiglu":
            self.linear3 = nn.Linear(d_model, dff, bias=use_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_model) -> (..., d_model)
        if self.activation == "swiglu":
            return self.linear2(nn.functional.silu(self.linear1(x)) * self.linear3(x))
        return self.linear2(ACTIVATIONS[self.activation](self.linear1(x)))
