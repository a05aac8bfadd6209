"""Attention mechanisms: nn.Modules that own parameters and call a kernel family."""

from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.standard import StandardAttention

__all__ = ["AttentionMechanism", "StandardAttention"]
