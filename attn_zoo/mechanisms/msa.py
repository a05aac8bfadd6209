"""Row and column attention over a multiple sequence alignment (Rao et al., "MSA Transformer",
ICML 2021, bioRxiv 2021.02.12.430858).

The input is an MSA embedding x (B, R, C, D): R aligned sequences (rows) of C columns. With
multi-head projections q, k, v of every token (head width d, per head h):

    msa_row, untied:  out_ri = sum_j softmax_j(<q_ri, k_rj> / sqrt(d)) v_rj
                      (every row is its own sequence: attention along the columns)
    msa_row, tied:    a_ij   = softmax_j( sum_r <q_ri, k_rj> / (sqrt(d) sqrt(R)) )
                      out_ri = sum_j a_ij v_rj
                      (one attention map per head shared by all rows: the logits are summed
                      over rows and scaled by 1/sqrt(R), the paper's "tied row attention")
    msa_column:       out_ri = sum_s softmax_s(<q_ri, k_si> / sqrt(d)) v_si
                      (every column is its own sequence: attention along the rows)

followed by the output projection Wo (concatenated heads -> D).

Padding: attn_mask is a boolean *padding mask* (B, R, C), True = real token (not the
(B, H, N, M) mask of sequence mechanisms). Padded tokens are never attended to, contribute
nothing to the tied sum, and output zeros; for the tied form R counts the rows of each MSA that
hold a real token. So a padded MSA gives, at its real tokens, exactly the output of the
unpadded one. (ESM's implementation scales by the padded row count instead and leaves padded
positions' outputs unspecified.) Causal masking has no meaning over an alignment and is
refused.

Backends are those of the softmax kernel (naive, chunked, fused, sdpa, ...). The tied form is
evaluated as one softmax attention whose head width is R * d: with q'_i = concat_r q_ri (and
k'_j, v'_j likewise), sum_r <q_ri, k_rj> = <q'_i, k'_j> and sum_j a_ij v'_j = concat_r out_ri.
The ``naive`` backend therefore builds one (B, H, C, C) logit map (never the per-row
(B, H, R, C, C) logits), and ``chunked`` computes it in tiles with O(C) memory, whatever R.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.mechanisms.base import AttentionMechanism, check_dropout
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads


class MSAAttention(AttentionMechanism):
    """Shared parts of the MSA mechanisms: projections wq, wk, wv, wo (bias as in ESM's
    MSA Transformer), the padding mask checks and the zeroing of padded outputs."""

    kernel_family = "softmax"

    def __init__(
        self, d_model: int, n_heads: int, dropout: float, bias: bool, backend: str
    ) -> None:
        check_heads(d_model, n_heads, None, None)
        check_dropout(dropout)
        super().__init__(backend)
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.wq = nn.Linear(d_model, d_model, bias=bias)
        self.wk = nn.Linear(d_model, d_model, bias=bias)
        self.wv = nn.Linear(d_model, d_model, bias=bias)
        self.wo = nn.Linear(d_model, d_model, bias=bias)

    def check_call(self, x, symbols, attn_mask, is_causal) -> None:
        name = type(self).__name__
        if symbols is not None:
            raise ValueError(f"{name} reads no symbols: pass symbols=None")
        if is_causal:
            raise ValueError(
                f"{name} does not support is_causal=True (an alignment has no causal order): "
                "pass is_causal=False, and padding as attn_mask (B, rows, cols)"
            )
        if x.dim() != 4 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x {tuple(x.shape)}: expected (B, rows, cols, d_model={self.d_model})"
            )
        if attn_mask is not None and (
            attn_mask.dtype != torch.bool or attn_mask.shape != x.shape[:3]
        ):
            raise ValueError(
                f"attn_mask must be a boolean padding mask (B, rows, cols) = {tuple(x.shape[:3])}"
                f", True = real token; got {attn_mask.dtype} {tuple(attn_mask.shape)}"
            )

    def heads(self, x: torch.Tensor) -> list[torch.Tensor]:
        """q, k, v of x (B, R, C, D), each (B, H, R, C, head_dim)."""
        return [
            rearrange(w(x), "b r c (h d) -> b h r c d", h=self.n_heads)
            for w in (self.wq, self.wk, self.wv)
        ]

    def attend(self, q, k, v, key_mask) -> torch.Tensor:
        return softmax_attention(
            q,
            k,
            v,
            attn_mask=key_mask,
            scale=self.head_dim**-0.5,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
        )

    def project_out(self, heads: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """Wo of heads (B, R, C, H * head_dim); padded tokens output zeros."""
        out = self.wo(heads)
        return out if attn_mask is None else out * attn_mask[..., None].to(out.dtype)


@register_mechanism("msa_row")
class MSARowAttention(MSAAttention):
    """Row attention over an MSA (B, R, C, D); tied=True shares one map across rows."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        tied: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        backend: str = "auto",
    ):
        super().__init__(d_model, n_heads, dropout, bias, backend)
        self.tied = tied

    def forward(
        self,
        x: torch.Tensor,  # (B, R, C, d_model)
        symbols: torch.Tensor | None = None,  # must be None
        attn_mask: torch.Tensor | None = None,  # bool padding mask (B, R, C), True = real
        is_causal: bool = False,  # must be False
    ) -> torch.Tensor:  # (B, R, C, d_model)
        self.check_call(x, symbols, attn_mask, is_causal)
        b, n_rows = x.shape[:2]
        q, k, v = self.heads(x)  # (B, H, R, C, d)
        if not self.tied:  # every row a sequence along the columns
            q, k, v = (rearrange(t, "b h r c d -> (b r) h c d") for t in (q, k, v))
            key_mask = None
            if attn_mask is not None:
                key_mask = rearrange(attn_mask, "b r c -> (b r) 1 1 c")
            out = self.attend(q, k, v, key_mask)  # (B R, H, C, d)
            out = rearrange(out, "(b r) h c d -> b r c (h d)", b=b)
            return self.project_out(out, attn_mask)

        if n_rows == 0:  # no row to tie (R d would be 0 wide): the empty output, (B, 0, C, D)
            return self.project_out(rearrange(v, "b h r c d -> b r c (h d)"), attn_mask)
        # tied: padded tokens drop out of the row sum; R counts each MSA's real rows
        key_mask, real_rows = None, torch.full((b,), n_rows, dtype=q.dtype, device=q.device)
        if attn_mask is not None:
            real = rearrange(attn_mask, "b r c -> b 1 r c 1").to(q.dtype)
            q, k, v = q * real, k * real, v * real
            key_mask = rearrange(attn_mask.any(dim=1), "b c -> b 1 1 c")  # real in some row
            real_rows = attn_mask.any(dim=2).sum(dim=1).clamp(min=1).to(q.dtype)
        q = q * rearrange(real_rows**-0.5, "b -> b 1 1 1 1")
        q, k, v = (rearrange(t, "b h r c d -> b h c (r d)") for t in (q, k, v))
        out = self.attend(q, k, v, key_mask)  # (B, H, C, R d)
        out = rearrange(out, "b h c (r d) -> b r c (h d)", r=n_rows)
        return self.project_out(out, attn_mask)

    def extra_repr(self) -> str:
        return f"tied={self.tied}, backend={self.backend!r}"


@register_mechanism("msa_column")
class MSAColumnAttention(MSAAttention):
    """Column attention over an MSA (B, R, C, D): every column attends along the rows."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        backend: str = "auto",
    ):
        super().__init__(d_model, n_heads, dropout, bias, backend)

    def forward(
        self,
        x: torch.Tensor,  # (B, R, C, d_model)
        symbols: torch.Tensor | None = None,  # must be None
        attn_mask: torch.Tensor | None = None,  # bool padding mask (B, R, C), True = real
        is_causal: bool = False,  # must be False
    ) -> torch.Tensor:  # (B, R, C, d_model)
        self.check_call(x, symbols, attn_mask, is_causal)
        q, k, v = (rearrange(t, "b h r c d -> (b c) h r d") for t in self.heads(x))
        key_mask = None if attn_mask is None else rearrange(attn_mask, "b r c -> (b c) 1 1 r")
        out = self.attend(q, k, v, key_mask)  # (B C, H, R, d)
        out = rearrange(out, "(b c) h r d -> b r c (h d)", b=x.shape[0])
        return self.project_out(out, attn_mask)
