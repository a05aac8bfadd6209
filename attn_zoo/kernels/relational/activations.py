"""Relation activations, by the names of the reference package (gelu is its tanh form)."""

import functools

import torch
import torch.nn.functional as F

REL_ACTIVATIONS = {
    "identity": lambda x: x,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
    "softmax": functools.partial(torch.softmax, dim=-1),  # over keys, unmasked
}
