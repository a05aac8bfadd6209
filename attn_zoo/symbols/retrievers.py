"""The symbol retrievers of the Dual Attention Transformer (Altabaa & Lafferty).

Parameter names and shapes follow `dual_attention.symbol_retrieval`, so checkpoints load as
they are. Symbols have width d_model: relational attention projects them with its W_v.

Cached decoding: every retriever takes `forward(x, offset=0)`, x the new positions offset ..
offset + N - 1 of the sequence (`retrieve` passes the offset only when it is nonzero), and
says by `cacheable` whether its symbols for the new positions are all a cached call needs:
per-token symbols (symbolic_attention) ignore the offset, positional symbols read E[offset +
i], relative symbols are one table whatever the offset (the mechanism reads it at j - i).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange, repeat
from torch import nn

from attn_zoo.kernels.relational.naive import relative_index
from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.symbols.registry import register_symbol_retriever


def retrieve(retriever: nn.Module, x: torch.Tensor, offset: int = 0):
    """retriever(x), or retriever(x, offset=offset) for positions after `offset` cached ones."""
    return retriever(x) if offset == 0 else retriever(x, offset=offset)


def cacheable(retriever: nn.Module | None) -> bool:
    """Whether cached decoding can use `retriever` (None, which retrieves nothing, can)."""
    return retriever is None or bool(getattr(retriever, "cacheable", False))


@register_symbol_retriever("symbolic_attention")
class SymbolicAttention(nn.Module):
    """Symbols retrieved by attention over a learned library (per head h):

        s_i^h = sum_k softmax_k(scale <W_q x_i, f_k>^h) lib_k^h

    template_features f and symbol_library lib are (n_symbols, d_model), split into n_heads
    slices; scale defaults to 1/sqrt(d_model / n_heads). Dropout acts on the weights in
    training only (the reference applies it in eval too; this is a deliberate difference).
    """

    absolute_positions = False  # per-token symbols: no position read

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_symbols: int,
        dropout: float = 0.0,
        scale: float | None = None,
        trainable_symbols: bool = True,
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"symbolic_attention: d_model={d_model} must be divisible by n_heads={n_heads}"
            )
        self.n_heads, self.dropout = n_heads, dropout
        self.scale = scale if scale is not None else (d_model / n_heads) ** -0.5
        self.template_features = nn.Parameter(torch.randn(n_symbols, d_model))
        self.symbol_library = nn.Parameter(
            torch.randn(n_symbols, d_model), requires_grad=trainable_symbols
        )
        self.q_proj = nn.Linear(d_model, d_model)

    cacheable = True  # per token: the new positions' symbols come from their own x

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        """Symbols of x's positions; `offset` (cached decoding) does not change them."""
        q = rearrange(self.q_proj(x), "b n (h d) -> b h n d", h=self.n_heads)
        k, v = (  # in q's dtype: under autocast q is half precision, the parameters float32
            repeat(t.to(q.dtype), "s (h d) -> b h s d", b=x.shape[0], h=self.n_heads)
            for t in (self.template_features, self.symbol_library)
        )
        out = softmax_attention(
            q, k, v, scale=self.scale, dropout_p=self.dropout if self.training else 0.0
        )
        return rearrange(out, "b h n d -> b n (h d)")


@register_symbol_retriever("positional_symbols")
class PositionalSymbolRetriever(nn.Module):
    """s_i = E[i]: one learned symbol per position, (B, N, symbol_dim) for N <= max_length.

    `sinusoidal=True` initialises E with the sinusoidal encoding (still trainable); the
    reference stores the flag but ignores it.
    """

    absolute_positions = True  # E[i]: the symbol of absolute position i

    def __init__(self, symbol_dim: int, max_length: int, sinusoidal: bool = False):
        super().__init__()
        self.max_length = max_length
        self.symbol_library = nn.Embedding(max_length, symbol_dim)
        if sinusoidal:
            position = torch.arange(max_length)[:, None]
            freq = torch.exp(torch.arange(0, symbol_dim, 2) * (-math.log(10000.0) / symbol_dim))
            with torch.no_grad():
                self.symbol_library.weight[:, 0::2] = torch.sin(position * freq)
                self.symbol_library.weight[:, 1::2] = torch.cos(position * freq)[
                    :, : symbol_dim // 2
                ]

    cacheable = True  # E[offset + i] for the new positions

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """(B, N, .) -> (B, N, symbol_dim): E[offset], .., E[offset + N - 1]."""
        n = x.shape[1]
        if offset + n > self.max_length:
            at = f" at offset {offset}" if offset else ""
            raise ValueError(
                f"positional_symbols: length {n}{at} exceeds max_length={self.max_length}"
            )
        symbols = self.symbol_library(torch.arange(offset, offset + n, device=x.device))
        return repeat(symbols, "n d -> b n d", b=x.shape[0])


RETURNS = ("output", "reference")


def check_returns(returns: str) -> str:
    if returns not in RETURNS:
        raise ValueError(f"returns={returns!r}: valid are {', '.join(map(repr, RETURNS))}")
    return returns


@dataclass(frozen=True)
class RelativeSymbols:
    """Symbols that depend on j - i only: s_ij = table[clip(j - i, -K, K) + K].

    table is (2K+1, d); it is never expanded to N x N x d by the efficient backends.
    """

    table: torch.Tensor
    max_rel_pos: int

    def dense(self, n: int, m: int | None = None) -> torch.Tensor:
        """The (n, m) pairs expanded: (n, m, d) with [i, j] = s_ij, the reference's form
        (relational attention takes it with use_relative_positional_symbols=True)."""
        m = n if m is None else m
        return self.table[relative_index(n, m, self.max_rel_pos, self.table.device)]


class RelativePositionTable(nn.Module):
    """Holds rel_pos_embeddings (2K+1, dim), the reference's RelativePositionalEncoding."""

    def __init__(self, dim: int, max_rel_pos: int):
        super().__init__()
        self.rel_pos_embeddings = nn.Parameter(torch.empty(2 * max_rel_pos + 1, dim))
        nn.init.xavier_uniform_(self.rel_pos_embeddings)


@register_symbol_retriever("position_relative")
class PositionRelativeSymbolRetriever(nn.Module):
    """Relative positional symbols s_ij = E[clip(j - i, -K, K) + K], K = max_rel_pos.

    Returns `RelativeSymbols`; relational attention reads them per (i, j) pair. With
    ``returns = "reference"`` (set by `attn_zoo.interop.dual_attention.port`) it returns them
    expanded, (N, N, symbol_dim), as the `dual-attention` reference does.
    """

    absolute_positions = False  # E[j - i]: relative positions only

    def __init__(self, symbol_dim: int, max_rel_pos: int):
        super().__init__()
        self.max_rel_pos = max_rel_pos
        self.rel_pos_enc = RelativePositionTable(symbol_dim, max_rel_pos)
        self.returns = "output"

    @property
    def returns(self) -> str:
        return getattr(self, "_returns", "output")  # modules pickled before it existed

    @returns.setter
    def returns(self, value: str) -> None:
        self._returns = check_returns(value)

    @property
    def cacheable(self) -> bool:
        """The table is: relational attention reads it at the offsets of a cached call. The
        reference's dense (N, N, d) symbols are not (they cover the new positions only)."""
        return self.returns == "output"

    def forward(self, x: torch.Tensor, offset: int = 0) -> RelativeSymbols | torch.Tensor:
        """The table as `RelativeSymbols` (whatever the offset), or with returns="reference"
        the dense (N, N, symbol_dim) symbols of x's positions."""
        symbols = RelativeSymbols(self.rel_pos_enc.rel_pos_embeddings, self.max_rel_pos)
        return symbols.dense(x.shape[1]) if self.returns == "reference" else symbols
