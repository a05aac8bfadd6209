"""One transformer block for encoders and decoders, with any registered attention mechanism.

    pre-norm:   x = x + drop(attn(norm1 x))      [x = x + drop(cross(norm2 x, context))]
                x = x + drop(ff(norm_ff x))
    post-norm:  x = norm1(x + drop(attn x))      [x = norm2(x + drop(cross(x, context)))]
                x = norm_ff(x + drop(ff x))

norm_ff is `norm2`, or `norm3` when the block has cross-attention (the reference's names).
Symbols (relational and dual attention) come from the caller, which computes them from the
residual stream, as in the Dual Attention Transformer. Dropout follows each sub-layer.
"""

from __future__ import annotations

import torch
from torch import nn

from attn_zoo.mechanisms.standard import StandardAttention
from attn_zoo.nn.feedforward import FeedForward
from attn_zoo.nn.norms import create_norm
from attn_zoo.nn.rotary import Rotary
from attn_zoo.registry import build, mechanism_kwargs


def build_attention(
    attention: str | nn.Module, d_model: int, kwargs: dict | None, dropout: float, backend: str
) -> nn.Module:
    """A mechanism by registry name (with d_model, dropout and backend filled in) or as given."""
    if isinstance(attention, nn.Module):
        if kwargs:
            raise ValueError("attention_kwargs are for a mechanism given by name, not a module")
        return attention
    kwargs = dict(kwargs or {})
    if "dropout" in mechanism_kwargs(attention):
        kwargs.setdefault("dropout", dropout)
    return build(attention, backend=backend, d_model=d_model, **kwargs)


class Block(nn.Module):
    def __init__(
        self,
        d_model: int,
        attention: str | nn.Module = "standard",
        attention_kwargs: dict | None = None,
        dff: int | None = None,
        activation: str = "relu",
        dropout: float = 0.0,
        norm_first: bool = True,
        norm_type: str = "layernorm",
        causal: bool = False,
        cross_attention: dict | None = None,
        bias: bool = True,
        backend: str = "auto",
    ):
        """attention_kwargs: the mechanism's kwargs (n_heads, ...); cross_attention: None, or
        the kwargs of a standard cross-attention (e.g. dict(n_heads=4)); bias: in the FFN."""
        super().__init__()
        self.norm_first, self.causal = norm_first, causal
        self.norm1 = create_norm(d_model, norm_type)
        self.attn = build_attention(attention, d_model, attention_kwargs, dropout, backend)
        self.cross_attn = None
        if cross_attention is not None:
            self.norm2 = create_norm(d_model, norm_type)
            cross = dict(cross_attention)
            cross.setdefault("dropout", dropout)
            self.cross_attn = StandardAttention(d_model, backend=backend, **cross)
            self.norm3 = create_norm(d_model, norm_type)
        else:
            self.norm2 = create_norm(d_model, norm_type)
        self.ff_block = FeedForward(d_model, dff, activation, use_bias=bias)
        self.dropout = nn.Dropout(dropout)

    @property
    def norm_ff(self) -> nn.Module:
        return self.norm2 if self.cross_attn is None else self.norm3

    def _attend(self, h, symbols, attn_mask, rope):
        call = {"attn_mask": attn_mask, "is_causal": self.causal}
        if symbols is not None:
            call["symbols"] = symbols
        if rope is not None:
            call["rope"] = rope
        return self.dropout(self.attn(h, **call))

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols=None,  # for relational / dual attention
        context: torch.Tensor | None = None,  # (B, M, d_model), with cross-attention
        attn_mask: torch.Tensor | None = None,  # self-attention mask, True = may attend
        rope: Rotary | None = None,
        context_mask: torch.Tensor | None = None,  # cross-attention mask (B?, 1?, N, M)
    ) -> torch.Tensor:
        if (context is None) != (self.cross_attn is None):
            raise ValueError(
                "context must be given exactly when the block has cross-attention "
                f"(cross_attention={'set' if self.cross_attn is not None else 'None'})"
            )
        if self.norm_first:
            x = x + self._attend(self.norm1(x), symbols, attn_mask, rope)
            if self.cross_attn is not None:
                cross = self.cross_attn(self.norm2(x), attn_mask=context_mask, context=context)
                x = x + self.dropout(cross)
            return x + self.dropout(self.ff_block(self.norm_ff(x)))
        x = self.norm1(x + self._attend(x, symbols, attn_mask, rope))
        if self.cross_attn is not None:
            cross = self.cross_attn(x, attn_mask=context_mask, context=context)
            x = self.norm2(x + self.dropout(cross))
        return self.norm_ff(x + self.dropout(self.ff_block(x)))
