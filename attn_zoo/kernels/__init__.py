"""Kernels: pure functions on tensors, one family per operation, one file per backend."""

from attn_zoo.kernels.dispatch import (
    Call,
    Capabilities,
    Choice,
    UnsupportedCallError,
    define_family,
    explain,
    family,
    recording_choices,
    register_backend,
)
from attn_zoo.kernels.softmax import softmax_attention

__all__ = [
    "Call",
    "Capabilities",
    "Choice",
    "UnsupportedCallError",
    "define_family",
    "explain",
    "family",
    "recording_choices",
    "register_backend",
    "softmax_attention",
]
