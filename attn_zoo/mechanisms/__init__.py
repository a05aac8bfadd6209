"""Attention mechanisms: nn.Modules that own parameters and call a kernel family."""

from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.dual import DualAttention
from attn_zoo.mechanisms.relational import RelationalAttention
from attn_zoo.mechanisms.standard import StandardAttention

__all__ = ["AttentionMechanism", "DualAttention", "RelationalAttention", "StandardAttention"]
