"""Kernels: pure functions on tensors, one family per operation, one file per backend."""

from attn_zoo.kernels.dispatch import (
    Call,
    Capabilities,
    UnsupportedCallError,
    family,
    register_backend,
)
from attn_zoo.kernels.softmax import softmax_attention

__all__ = [
    "Call",
    "Capabilities",
    "UnsupportedCallError",
    "family",
    "register_backend",
    "softmax_attention",
]
