"""Attention mechanisms: nn.Modules that own parameters and call a kernel family."""

from attn_zoo.mechanisms.additive import AdditiveAttention
from attn_zoo.mechanisms.axial import AxialAttention
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.differential import DifferentialAttention
from attn_zoo.mechanisms.dual import DualAttention
from attn_zoo.mechanisms.gla import GatedLinearAttention
from attn_zoo.mechanisms.linear import LinearAttention
from attn_zoo.mechanisms.msa import MSAColumnAttention, MSARowAttention
from attn_zoo.mechanisms.relational import RelationalAttention
from attn_zoo.mechanisms.sigmoid import SigmoidAttention
from attn_zoo.mechanisms.softcapped import SoftcappedAttention
from attn_zoo.mechanisms.standard import StandardAttention

__all__ = [
    "AdditiveAttention",
    "AttentionMechanism",
    "DifferentialAttention",
    "AxialAttention",
    "DualAttention",
    "GatedLinearAttention",
    "LinearAttention",
    "MSAColumnAttention",
    "MSARowAttention",
    "RelationalAttention",
    "SigmoidAttention",
    "SoftcappedAttention",
    "StandardAttention",
]
