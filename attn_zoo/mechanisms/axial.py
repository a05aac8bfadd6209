"""Axial attention (Ho et al., "Axial Attention in Multidimensional Transformers",
arXiv 1912.12180).

For an input with k axes, x (B, d_1, ..., d_k, D) (the embedding axis D at `dim_index`), axis a
has its own multi-head softmax self-attention Attn_a that runs along axis a only: every line
of positions that differ only in their index along a is one sequence of length d_a, the other
axes are batch. Per head, along a line (positions i, j on axis a):

    Attn_a(x)_i = Wo_a concat_h( sum_j softmax_j(<Wq_a^h x_i, Wk_a^h x_j> / sqrt(head_dim))
                                 Wv_a^h x_j )

combined over the axes either by sum or in sequence (no residual in between):

    combine="sum":         out = sum_a Attn_a(x)
    combine="sequential":  out = Attn_k(... Attn_2(Attn_1(x)))

Cost sum_a (prod_b d_b) d_a instead of (prod_b d_b)^2 for full attention. is_causal=True
masks every axis causally (top-left): position (i_1..i_k) sees only positions not after it
along the attended axis, so the raster order stays autoregressive. attn_mask is not supported.

Kwargs and layout follow the `axial-attention` package (lucidrains, AxialAttention): n_axes is
its num_dimensions, head_dim its dim_heads, combine="sum" its sum_axial_out=True; the axes
are attended in increasing index order; Wq, Wk, Wv have no bias and Wo has one.
`attn_zoo.interop.axial_attention.port` converts its modules. Backends are those of the
softmax kernel (naive, chunked, fused, sdpa, ...), used by every axis.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.mechanisms.base import AttentionMechanism, check_dropout, check_int
from attn_zoo.mechanisms.registry import register_mechanism

COMBINE = ("sum", "sequential")


class AxisProjections(nn.Module):
    """The projections of one axis' attention: wq, wk, wv (d_model -> n_heads * head_dim, no
    bias) and wo (n_heads * head_dim -> d_model, with bias)."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int):
        super().__init__()
        hidden = n_heads * head_dim
        self.wq = nn.Linear(d_model, hidden, bias=False)
        self.wk = nn.Linear(d_model, hidden, bias=False)
        self.wv = nn.Linear(d_model, hidden, bias=False)
        self.wo = nn.Linear(hidden, d_model)


@register_mechanism("axial")
class AxialAttention(AttentionMechanism):
    """Attention along each axis of a (B, d_1, ..., d_k, D) tensor (D at `dim_index`)."""

    kernel_family = "softmax"

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_axes: int = 2,
        head_dim: int | None = None,
        dim_index: int = -1,
        combine: str = "sum",
        dropout: float = 0.0,
        backend: str = "auto",
    ):
        check_int("d_model", d_model)
        check_int("n_heads", n_heads)
        check_int("n_axes", n_axes)
        check_int("head_dim", head_dim, optional=True)
        check_dropout(dropout)
        if head_dim is None and d_model % n_heads:
            raise ValueError(
                f"n_heads={n_heads}: must be >= 1 and divide d_model={d_model} (or give head_dim)"
            )
        if head_dim is not None and head_dim < 1:
            raise ValueError(f"head_dim={head_dim}: must be >= 1 (or None: d_model // n_heads)")
        if n_axes < 1:
            raise ValueError(f"n_axes={n_axes}: must be >= 1")
        rank = n_axes + 2  # batch, the axes, the embedding
        if not (1 <= dim_index < rank or -rank < dim_index <= -1):
            raise ValueError(
                f"dim_index={dim_index}: the embedding axis of a {rank}-D input (B, axes.., D) "
                f"must be in 1..{rank - 1} or -{rank - 1}..-1 (0 is the batch axis)"
            )
        if combine not in COMBINE:
            raise ValueError(f"combine={combine!r}: valid are {COMBINE}")
        super().__init__(backend)
        self.d_model, self.n_heads, self.n_axes = d_model, n_heads, n_axes
        self.head_dim = d_model // n_heads if head_dim is None else head_dim
        self.dim_index = dim_index % rank
        self.combine, self.dropout = combine, dropout
        self.axes = nn.ModuleList(
            AxisProjections(d_model, n_heads, self.head_dim) for _ in range(n_axes)
        )

    def attend_along(
        self, x: torch.Tensor, axis: int, proj: AxisProjections, is_causal: bool
    ) -> torch.Tensor:
        """Self-attention along `axis` of x (B, d_1, ..., d_k, D), embedding last; same shape."""
        lines = x.movedim(axis, -2)  # (B, .., d_axis, D): the attended axis next to D
        batch_shape = lines.shape[:-2]
        lines = lines.reshape(batch_shape.numel(), *lines.shape[-2:])  # (B', L, D), B' the rest
        q, k, v = (
            rearrange(w(lines), "b l (h d) -> b h l d", h=self.n_heads)
            for w in (proj.wq, proj.wk, proj.wv)
        )
        out = softmax_attention(
            q,
            k,
            v,
            is_causal=is_causal,
            scale=self.head_dim**-0.5,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
        )  # (B', H, L, head_dim)
        out = proj.wo(rearrange(out, "b h l d -> b l (h d)"))  # (B', L, D)
        return out.reshape(*batch_shape, *out.shape[-2:]).movedim(-2, axis)

    def forward(
        self,
        x: torch.Tensor,  # (B, d_1, ..., d_k, D), D at dim_index
        symbols: torch.Tensor | None = None,  # must be None: axial attention reads no symbols
        attn_mask: torch.Tensor | None = None,  # must be None
        is_causal: bool = False,  # causal along every axis
    ) -> torch.Tensor:  # same shape as x
        if symbols is not None:
            raise ValueError("axial attention reads no symbols: pass symbols=None")
        if attn_mask is not None:
            raise ValueError(
                "axial attention does not support attn_mask: pass attn_mask=None "
                "(is_causal=True masks every axis causally)"
            )
        if x.dim() != self.n_axes + 2 or x.shape[self.dim_index] != self.d_model:
            raise ValueError(
                f"x {tuple(x.shape)}: expected {self.n_axes + 2}-D (batch, {self.n_axes} axes, "
                f"embedding) with d_model={self.d_model} at dim_index={self.dim_index}"
            )
        h = x.movedim(self.dim_index, -1)  # (B, d_1, ..., d_k, D)
        if self.combine == "sum":
            out = sum(
                self.attend_along(h, axis, proj, is_causal)
                for axis, proj in enumerate(self.axes, start=1)
            )
        else:
            out = h
            for axis, proj in enumerate(self.axes, start=1):
                out = self.attend_along(out, axis, proj, is_causal)
        return out.movedim(-1, self.dim_index)

    def extra_repr(self) -> str:
        return (
            f"n_axes={self.n_axes}, dim_index={self.dim_index}, combine={self.combine!r}, "
            f"backend={self.backend!r}"
        )
