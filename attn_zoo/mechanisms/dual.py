"""Dual attention (Altabaa & Lafferty, arXiv 2405.16727): standard self-attention heads and
relational attention heads side by side, combined by `combine`:

    "concat": out = concat(SelfAttention_{n_heads_sa}(x), RelationalAttention_{n_heads_ra}(x, s))
    "sum":    out = SelfAttention_{n_heads_sa}(x) + RelationalAttention_{n_heads_ra}(x, s)

"concat" (the default) is the reference's: each branch has head_dim = d_model // (n_heads_sa +
n_heads_ra) and its own square output projection; there is no joint projection (as in
`dual_attention.dual_attention.DualAttention`, whose kwargs and parameter names are kept).
"sum": each branch is as wide as the model, its heads d_model // (its own head count) wide and
its output projection (d_model, d_model): a joint output projection over the heads of both
branches, concat(A_sa, A_ra) [Wo_sa; Wo_ra]. Its self-attention branch is then standard
attention of n_heads_sa heads itself, to which relational heads are added (how
attn_zoo/interop/surgery.py adds them to a model's attention). share_attn_params makes the
self-attention's wq and wk the relational branch's wq_attn and wk_attn (n_heads_sa must equal
n_heads_ra).

Backends are the tier names naive, chunked and fused (and auto): each branch runs its own
kernel family at that tier. Symbols go to the relational branch (see relational.py: absolute,
dense pairwise with use_relative_positional_symbols, or `RelativeSymbols`); an empty sequence
(N = 0) gives an empty (B, 0, d_model) output. ``returns = "reference"`` makes forward return
the reference's tuple (output, self-attention weights (B, H_sa, N, N) if need_weights else
None, [attention (B, H_ra, N, N), relations (B, N, N, R)]), None for an absent branch; with
need_weights the self-attention branch runs materialised, as the reference's manual path.

Cached decoding (`cache`, a `LayerCache`): each branch caches what it caches alone (see
standard.py and relational.py) in a child of the cache, "sa" and "ra"; the mechanism's own
retriever is asked for the new positions' symbols (the cache's offset).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import einsum, rearrange

from attn_zoo.kernels.dispatch import TIERS
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.rotary import Rotary
from attn_zoo.mechanisms.base import AttentionMechanism, check_int
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.registry import MECHANISMS, register_mechanism
from attn_zoo.mechanisms.relational import (
    RelationalAttention,
    retriever_or_none,
    retriever_positions,
)
from attn_zoo.mechanisms.standard import StandardAttention
from attn_zoo.symbols import RelativeSymbols
from attn_zoo.symbols.retrievers import cacheable, check_returns, retrieve

BRANCH_FIXED = {"d_model", "n_heads", "total_n_heads", "dropout", "backend"}
COMBINE = ("concat", "sum")


@register_mechanism("dual")
class DualAttention(AttentionMechanism):
    combine = "concat"  # modules pickled before it existed: the reference's

    def __init__(
        self,
        d_model: int,
        n_heads_sa: int,
        n_heads_ra: int,
        dropout: float = 0.0,
        sa_kwargs: dict | None = None,
        ra_kwargs: dict | None = None,
        share_attn_params: bool = False,
        ra_type: str = "relational_attention",
        symbol_retrieval: str | None = None,
        symbol_retrieval_kwargs: dict | None = None,
        combine: str = "concat",
        backend: str = "auto",
    ):
        check_int("n_heads_sa", n_heads_sa, low=0)
        check_int("n_heads_ra", n_heads_ra, low=0)
        if n_heads_sa + n_heads_ra == 0:
            raise ValueError(
                f"n_heads_sa={n_heads_sa}, n_heads_ra={n_heads_ra}: need >= 0 each, > 0 in total"
            )
        if share_attn_params and n_heads_sa != n_heads_ra:
            raise ValueError(
                f"share_attn_params needs n_heads_sa == n_heads_ra, "
                f"got {n_heads_sa} and {n_heads_ra}"
            )
        if ra_type != "relational_attention":
            raise ValueError(f"ra_type={ra_type!r}: only 'relational_attention' is available")
        if combine not in COMBINE:
            raise ValueError(f"combine={combine!r}: valid are {COMBINE}")
        sa_kwargs, ra_kwargs = dict(sa_kwargs or {}), dict(ra_kwargs or {})
        MECHANISMS.check_kwargs("standard", sa_kwargs, BRANCH_FIXED, where="sa_kwargs")
        MECHANISMS.check_kwargs("relational", ra_kwargs, BRANCH_FIXED, where="ra_kwargs")
        super().__init__(backend)
        self.combine = combine
        common = dict(d_model=d_model, dropout=dropout, backend=backend)
        # a branch's heads are d_model // total_n_heads wide: both branches' heads ("concat"),
        # its own ("sum")
        total = n_heads_sa + n_heads_ra
        sa_total, ra_total = (total, total) if combine == "concat" else (n_heads_sa, n_heads_ra)
        self.self_attention = (
            StandardAttention(n_heads=n_heads_sa, total_n_heads=sa_total, **common, **sa_kwargs)
            if n_heads_sa
            else None
        )
        self.relational_attention = (
            RelationalAttention(n_heads=n_heads_ra, total_n_heads=ra_total, **common, **ra_kwargs)
            if n_heads_ra
            else None
        )
        if share_attn_params:
            self.self_attention.wq = self.relational_attention.wq_attn
            self.self_attention.wk = self.relational_attention.wk_attn
        self.symbol_retriever = retriever_or_none(
            symbol_retrieval, symbol_retrieval_kwargs, d_model
        )
        if symbol_retrieval == "position_relative" and self.relational_attention is not None:
            self.relational_attention.use_relative_positional_symbols = True
        self.returns = "output"

    @property
    def supports_cache(self) -> bool:
        """Each branch caches where it can alone (not the self-attention branch under a mask
        mod opening the causal mask, prefix_lm: standard.py); the mechanism's own retriever
        must serve cached calls."""
        branches = (self.self_attention, self.relational_attention)
        each = all(branch is None or branch.supports_cache for branch in branches)
        return each and cacheable(self.symbol_retriever)

    def absolute_positions(self) -> str | None:
        """What of the layer reads absolute positions (its branches' mods and retriever, its
        own retriever: standard.py, relational.py), named; None if nothing does."""
        branches = (self.self_attention, self.relational_attention)
        parts = [branch.absolute_positions() for branch in branches if branch is not None]
        parts.append(retriever_positions(self.symbol_retriever))
        return " and ".join(part for part in parts if part) or None

    @property
    def returns(self) -> str:
        """Either "output" (forward returns the output) or "reference" (the reference's tuple); the
        relational branch follows."""
        return getattr(self, "_returns", "output")  # modules pickled before it existed

    @returns.setter
    def returns(self, value: str) -> None:
        self._returns = check_returns(value)
        if self.relational_attention is not None:
            self.relational_attention.returns = value

    @classmethod
    def backend_names(cls) -> list[str]:
        return list(TIERS)

    @classmethod
    def backend_status(cls, backend: str, device: str = "cpu") -> tuple[bool, str]:
        cls.check_backend(backend)
        reasons = []
        for branch in (StandardAttention, RelationalAttention):
            ok, reason = branch.backend_status(backend, device)
            if not ok:
                return False, f"{branch.__name__}: {reason}"
            reasons.append(f"{branch.kernel_family}: {reason}")
        return True, "; ".join(reasons)

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols: torch.Tensor | RelativeSymbols | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rope: Rotary | None = None,
        need_weights: bool = False,  # returns="reference": also the self-attention weights
        cache: LayerCache | None = None,  # cached decoding: a child cache per branch
    ):
        """(B, N, d_model); with returns="reference" the reference's tuple (module docstring)."""
        reference = self.returns == "reference"
        outputs, sa_weights, ra_maps = [], None, None
        offset = 0 if cache is None else cache.length
        if cache is not None:
            if reference and need_weights:
                raise ValueError("need_weights (the reference's manual path) takes no cache")
            cache.advance(x.shape[1])
        if self.self_attention is not None:
            if x.shape[1] == 0:  # nothing to attend (not every softmax backend takes no keys)
                outputs.append(self._empty_branch(self.self_attention, x))
                if reference and need_weights:
                    sa_weights = x.new_zeros(x.shape[0], self.self_attention.n_heads, 0, 0)
            elif cache is not None:
                sa_cache = cache.child("sa")
                outputs.append(
                    self.self_attention(
                        x, attn_mask=attn_mask, is_causal=is_causal, rope=rope, cache=sa_cache
                    )
                )
            elif reference and need_weights:
                out, sa_weights = self._self_attention_with_weights(x, attn_mask, is_causal, rope)
                outputs.append(out)
            else:
                outputs.append(
                    self.self_attention(x, attn_mask=attn_mask, is_causal=is_causal, rope=rope)
                )
        if self.relational_attention is not None:
            if symbols is None and self.symbol_retriever is not None:
                symbols = retrieve(self.symbol_retriever, x, offset)
            ra_cache = None if cache is None else cache.child("ra")
            result = self.relational_attention(x, symbols, attn_mask, is_causal, rope, ra_cache)
            out, *ra_maps = result if isinstance(result, tuple) else (result,)
            outputs.append(out)
        out = torch.cat(outputs, dim=-1) if self.combine == "concat" else sum(outputs)
        return (out, sa_weights, ra_maps) if reference else out

    @staticmethod
    def _empty_branch(branch: StandardAttention, x: torch.Tensor) -> torch.Tensor:
        """The branch's (B, 0, width) output of an empty sequence, in the graph of x and wo."""
        return branch.wo(x[..., :1].expand(*x.shape[:2], branch.wo.in_features))

    def _self_attention_with_weights(self, x, attn_mask, is_causal, rope):
        """Self-attention output and its weights (B, H_sa, N, N) by the reference's manual
        path (need_weights=True): the weights materialised (after dropout, in training) and the
        output made from them, one set of queries and keys for both; the branch's score and
        mask mods and its causality applied and its call checked, as in its forward
        (`StandardAttention.weights_and_values`)."""
        sa = self.self_attention
        weights, v = sa.weights_and_values(x, x, attn_mask, is_causal, rope)
        weights = weights.to(v.dtype)
        if self.training and sa.dropout > 0:
            weights = F.dropout(weights, sa.dropout)
        out = einsum(weights, repeat_kv(v, sa.n_heads), "b h n m, b h m d -> b n h d")
        return sa.resid_dropout(sa.wo(rearrange(out, "b n h d -> b n (h d)"))), weights
