"""One transformer block for encoders and decoders, with any registered attention mechanism.

    pre-norm:   x = x + drop(attn(norm1 x))      [x = x + drop(cross(norm2 x, context))]
                x = x + drop(ff(norm_ff x))
    post-norm:  x = norm1(x + drop(attn x))      [x = norm2(x + drop(cross(x, context)))]
                x = norm_ff(x + drop(ff x))

norm_ff is `norm2`, or `norm3` when the block has cross-attention (the reference's names).
Symbols (relational and dual attention) come from the caller, which computes them from the
residual stream, as in the Dual Attention Transformer. Dropout follows each sub-layer.

Cached decoding: `forward(..., cache=layer_cache)` hands the block's `LayerCache` to its
self-attention, which keeps what it needs of the positions before x; a causal block then calls
it with is_causal="bottom_right" (x's positions are the last ones). Only mechanisms with
`supports_cache` take a cache (`Block.supports_cache`).

`BlockConfig` holds every setting a block takes (as nanoGPT's GPTConfig); every model of the
family takes one, or its fields as keyword arguments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from attn_zoo.kernels.rotary import Rotary
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.registry import build, mechanism_kwargs
from attn_zoo.mechanisms.standard import StandardAttention
from attn_zoo.models.feedforward import FeedForward
from attn_zoo.models.norms import create_norm
from attn_zoo.registry import unknown_name_error

BLOCK_FILLED = ("d_model", "backend")  # what a block gives its mechanisms from its own fields


@dataclass(frozen=True)
class BlockConfig:
    """The settings of a model's blocks, and where their symbols come from.

    attention / attention_kwargs: a registered mechanism name and its kwargs (n_heads, ...),
    or a module; dff: feed-forward width (default 4 d_model, 8/3 d_model for swiglu);
    bias: in the feed-forward; attention_residual: False makes the self-attention sub-layer's
    output replace the stream instead of adding to it (no skip connection around attention:
    what follows sees only what attention computed; the Abstractor's relational bottleneck for
    relational attention, whose output holds relations and symbols only, but not for standard
    or dual attention, whose values carry the objects themselves on); causal: self-attention
    masked to the past; cross_attention: None, or the kwargs of a standard cross-attention
    (e.g. dict(n_heads=4)); symbol_retrieval (+ kwargs): the retriever feeding relational and
    dual attention, one shared by all layers or one per layer (shared_symbol_retriever).
    """

    d_model: int
    attention: str | nn.Module = "standard"
    attention_kwargs: dict | None = None
    dff: int | None = None
    activation: str = "relu"
    dropout: float = 0.0
    norm_first: bool = True
    norm_type: str = "layernorm"
    bias: bool = True
    attention_residual: bool = True
    causal: bool = False
    cross_attention: dict | None = None
    backend: str = "auto"
    symbol_retrieval: str | None = None
    symbol_retrieval_kwargs: dict | None = None
    shared_symbol_retriever: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.d_model, bool) or not isinstance(self.d_model, int) or self.d_model < 1:
            raise ValueError(f"d_model={self.d_model!r}: must be an integer >= 1")
        if self.dff is not None and (not isinstance(self.dff, int) or self.dff < 1):
            raise ValueError(f"dff={self.dff!r}: must be None or an integer >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r}: must be in [0, 1)")
        for where in ("attention_kwargs", "cross_attention"):
            for key in BLOCK_FILLED:
                if key in (getattr(self, where) or {}):
                    raise ValueError(
                        f"{where}[{key!r}]={getattr(self, where)[key]!r}: the block fills in "
                        f"its mechanisms' {key}; set the block's own field {key}= (BlockConfig."
                        f"{key}) instead"
                    )

    @classmethod
    def fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def resolve(cls, config: BlockConfig | None = None, **settings) -> BlockConfig:
        """`config` with `settings` replacing its fields (or a new config from `settings`);
        ValueError naming an unknown setting."""
        for key in settings:
            if key not in cls.fields():
                raise unknown_name_error("block setting (BlockConfig field)", key, cls.fields())
        return cls(**settings) if config is None else dataclasses.replace(config, **settings)

    def block_settings(self) -> dict:
        """The fields `Block` uses (all but the symbol-retrieval ones)."""
        skip = {"symbol_retrieval", "symbol_retrieval_kwargs", "shared_symbol_retriever"}
        return {f: getattr(self, f) for f in self.fields() if f not in skip}


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
    def __init__(self, config: BlockConfig | None = None, **settings):
        """Block(config) or Block(d_model=..., attention=..., ...): see `BlockConfig`."""
        super().__init__()
        c = BlockConfig.resolve(config, **settings)
        self.norm_first, self.causal = c.norm_first, c.causal
        self.attention_residual = c.attention_residual
        self.norm1 = create_norm(c.d_model, c.norm_type)
        self.attn = build_attention(
            c.attention, c.d_model, c.attention_kwargs, c.dropout, c.backend
        )
        self.cross_attn = None
        self.norm2 = create_norm(c.d_model, c.norm_type)
        if c.cross_attention is not None:
            cross = dict(c.cross_attention)
            cross.setdefault("dropout", c.dropout)
            self.cross_attn = StandardAttention(c.d_model, backend=c.backend, **cross)
            self.norm3 = create_norm(c.d_model, c.norm_type)
        self.ff_block = FeedForward(c.d_model, c.dff, c.activation, use_bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    @property
    def norm_ff(self) -> nn.Module:
        return self.norm2 if self.cross_attn is None else self.norm3

    @property
    def supports_cache(self) -> bool:
        """Whether the self-attention takes a cache (cached decoding). Cross-attention, if
        any, reads its whole context on every call and needs none."""
        return bool(getattr(self.attn, "supports_cache", False))

    def _attend(self, h, symbols, attn_mask, rope, cache):
        call = {"attn_mask": attn_mask, "is_causal": self.causal}
        if symbols is not None:
            call["symbols"] = symbols
        if rope is not None:
            call["rope"] = rope
        if cache is not None:
            if not self.supports_cache:
                raise ValueError(
                    f"{type(self.attn).__name__} takes no cache (supports_cache is False); "
                    "run without one"
                )
            call["cache"] = cache
            call["is_causal"] = "bottom_right" if self.causal else False
        return self.dropout(self.attn(h, **call))

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols=None,  # for relational / dual attention
        context: torch.Tensor | None = None,  # (B, M, d_model), with cross-attention
        attn_mask: torch.Tensor | None = None,  # self-attention mask, True = may attend
        rope: Rotary | None = None,
        context_mask: torch.Tensor | None = None,  # cross-attention mask (B?, 1?, N, M)
        cache: LayerCache | None = None,  # cached decoding: the positions before x
    ) -> torch.Tensor:
        if (context is None) != (self.cross_attn is None):
            raise ValueError(
                "context must be given exactly when the block has cross-attention "
                f"(cross_attention={'set' if self.cross_attn is not None else 'None'})"
            )
        skip = x if self.attention_residual else 0  # 0: attention's output replaces x
        if self.norm_first:
            x = skip + self._attend(self.norm1(x), symbols, attn_mask, rope, cache)
            if self.cross_attn is not None:
                cross = self.cross_attn(self.norm2(x), attn_mask=context_mask, context=context)
                x = x + self.dropout(cross)
            return x + self.dropout(self.ff_block(self.norm_ff(x)))
        x = self.norm1(skip + self._attend(x, symbols, attn_mask, rope, cache))
        if self.cross_attn is not None:
            cross = self.cross_attn(x, attn_mask=context_mask, context=context)
            x = self.norm2(x + self.dropout(cross))
        return self.norm_ff(x + self.dropout(self.ff_block(x)))
