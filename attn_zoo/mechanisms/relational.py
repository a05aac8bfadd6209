"""Relational attention (Altabaa & Lafferty, "Disentangling and Integrating Relational and
Sensory Information in Transformer Architectures", arXiv 2405.16727).

Per head h, with symbols s_j (or relative symbols s_ij) and relations l = 1..R:

    a_ij^h = softmax_j(<Wq^h x_i, Wk^h x_j> / sqrt(head_dim))           (attention, masked)
    r_ij^l = act(<Wq_rel^l x_i, Wk_rel^l x_j> / sqrt(rel_proj_dim))     (relations, unmasked)
    A_i^h  = sum_j a_ij^h (Wv^h s_j + Wr^h r_ij)                        r_ij = (r_ij^1..r_ij^R)
    out    = concat_h(A_i^h) Wo

Kwargs and parameter names follow `dual_attention.relational_attention.RelationalAttention`
(wr (H, head_dim, R), wq_attn, wk_attn, wq_rel, wk_rel, wv, wo), so its checkpoints load
as they are. Differences, all deliberate: a query row with no allowed key gives zeros (the
reference gives NaN); rel_proj_dim may be any width (the reference requires
rel_proj_dim * n_relations == head_dim * n_heads); the mechanism may own a symbol retriever.

Symbols, width d_model: absolute (B, N, d_model); with use_relative_positional_symbols=True,
pairwise s_ij as the reference takes them, dense (N, N, d_model) or (B, N, N, d_model)
(backends naive and chunked); or the `RelativeSymbols` of a position_relative retriever
(never expanded). ``returns = "reference"`` makes forward return the reference's tuple
(output, attention (B, H, N, N), relations (B, N, N, R)), the weights of the very pass.

Cached decoding (`cache`, a `LayerCache`): cached are the attention keys k (after RoPE), the
relation keys kr and the symbol values v = Wv s_j of every position seen (kv heads under GQA);
a call appends its new positions' and attends with is_causal="bottom_right" (the caller's).
Symbols are those of the new positions (a retriever is asked with the cache's offset).
Relative symbols cache no values: the table is read at clip(j - i, -K, K) for the new queries
i = offset.. (as v for one new query, as pairwise v_pair for several after a prefix). Dense
pairwise symbols (use_relative_positional_symbols with a tensor) cannot be cached.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import nn

from attn_zoo.kernels.relational import relational_attention
from attn_zoo.kernels.relational.activations import REL_ACTIVATIONS
from attn_zoo.kernels.relational.family import check_inputs
from attn_zoo.kernels.relational.naive import (
    aggregate,
    attention_tensor,
    relation_tensor,
    relative_index,
)
from attn_zoo.kernels.rotary import Rotary
from attn_zoo.mechanisms.base import AttentionMechanism, check_dropout, check_int
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads
from attn_zoo.symbols import RelativeSymbols, build_symbol_retriever, list_symbol_retrievers
from attn_zoo.symbols.retrievers import cacheable, check_returns, retrieve


def retriever_or_none(name: str | None, kwargs: dict | None, d_model: int) -> nn.Module | None:
    return None if name is None else build_symbol_retriever(name, d_model, **(kwargs or {}))


def retriever_positions(retriever: nn.Module | None) -> str | None:
    """What of `retriever` reads absolute positions, named, by its `absolute_positions`
    declaration (attn_zoo/symbols/retrievers.py: positional symbols E[i] do; per-token and
    relative symbols do not; a retriever that does not declare it counts as reading them);
    None if it reads none."""
    if retriever is None or not getattr(retriever, "absolute_positions", True):
        return None
    return f"symbol retriever {type(retriever).__name__} (it reads absolute positions)"


@register_mechanism("relational")
class RelationalAttention(AttentionMechanism):
    kernel_family = "relational"

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_relations: int | None = None,
        dropout: float = 0.0,
        key_dim: int | None = None,
        n_kv_heads: int | None = None,
        rel_activation: str = "identity",
        rel_proj_dim: int | None = None,
        add_bias_kv: bool = False,
        add_bias_out: bool = False,
        total_n_heads: int | None = None,
        symmetric_rels: bool = False,
        use_relative_positional_symbols: bool = False,
        symbol_retrieval: str | None = None,
        symbol_retrieval_kwargs: dict | None = None,
        backend: str = "auto",
    ):
        check_heads(d_model, n_heads, n_kv_heads, total_n_heads)
        for name, value in (("n_relations", n_relations), ("key_dim", key_dim)):
            check_int(name, value, optional=True)
        check_dropout(dropout)
        if rel_activation not in REL_ACTIVATIONS:
            raise ValueError(
                f"rel_activation={rel_activation!r}: valid are {sorted(REL_ACTIVATIONS)}"
            )
        super().__init__(backend)
        self.n_heads = n_heads
        self.n_relations = n_heads if n_relations is None else n_relations
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.head_dim = d_model // (n_heads if total_n_heads is None else total_n_heads)
        self.key_dim = self.head_dim if key_dim is None else key_dim
        self.rel_proj_dim = (
            (self.head_dim * n_heads) // self.n_relations if rel_proj_dim is None else rel_proj_dim
        )
        if self.n_relations < 1 or self.rel_proj_dim < 1:
            raise ValueError(
                f"n_relations={n_relations}, rel_proj_dim={rel_proj_dim}: both must be >= 1"
            )
        self.rel_activation, self.dropout = rel_activation, dropout
        self.symbol_retriever = retriever_or_none(
            symbol_retrieval, symbol_retrieval_kwargs, d_model
        )
        self.use_relative_positional_symbols = (
            use_relative_positional_symbols or symbol_retrieval == "position_relative"
        )

        self.wr = nn.Parameter(torch.empty(n_heads, self.head_dim, self.n_relations))
        nn.init.kaiming_uniform_(self.wr, a=math.sqrt(5))
        self.wq_attn = nn.Linear(d_model, n_heads * self.key_dim, bias=False)
        self.wk_attn = nn.Linear(d_model, self.n_kv_heads * self.key_dim, bias=add_bias_kv)
        self.wq_rel = nn.Linear(d_model, self.n_relations * self.rel_proj_dim, bias=False)
        self.wk_rel = (
            self.wq_rel
            if symmetric_rels
            else nn.Linear(d_model, self.n_relations * self.rel_proj_dim, bias=False)
        )
        self.wv = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=add_bias_kv)
        self.wo = nn.Linear(n_heads * self.head_dim, n_heads * self.head_dim, bias=add_bias_out)
        self.resid_dropout = nn.Dropout(dropout)
        self.returns = "output"

    @property
    def supports_cache(self) -> bool:
        """Cached decoding works (k, kr, symbol values cached) unless the mechanism's own
        retriever cannot serve it (see `attn_zoo.symbols.retrievers.cacheable`)."""
        return cacheable(self.symbol_retriever)

    def absolute_positions(self) -> str | None:
        """What of the layer reads absolute positions (`retriever_positions`), or None."""
        return retriever_positions(self.symbol_retriever)

    @property
    def returns(self) -> str:
        """Either "output" (forward returns the output) or "reference" (the reference's tuple)."""
        return getattr(self, "_returns", "output")  # modules pickled before it existed

    @returns.setter
    def returns(self, value: str) -> None:
        self._returns = check_returns(value)

    def symbol_values(self, x: torch.Tensor, symbols, offset: int = 0) -> dict:
        """Kernel kwargs for the symbols: v (B, Hkv, N, hd), v_rel (Hkv, 2K+1, hd) or v_pair
        (B?, Hkv, N, N, hd); `offset`: x's first position (cached decoding), for a retriever."""
        if symbols is None:
            if self.symbol_retriever is None:
                raise ValueError(
                    "relational attention needs symbols: pass symbols=... or build it with "
                    f"symbol_retrieval= one of {list_symbol_retrievers()}"
                )
            symbols = retrieve(self.symbol_retriever, x, offset)
        relative = isinstance(symbols, RelativeSymbols)  # the type says it
        width = self.wv.in_features
        if (symbols.table if relative else symbols).shape[-1] != width:
            shape = tuple((symbols.table if relative else symbols).shape)
            name = "symbols.table" if relative else "symbols"
            raise ValueError(f"{name} {shape}: the last dimension must be d_model={width}")
        if relative:
            table = rearrange(self.wv(symbols.table), "c (h d) -> h c d", h=self.n_kv_heads)
            return {"v_rel": table}
        b, n = x.shape[:2]
        if self.use_relative_positional_symbols:  # pairwise, as the reference takes them
            if (
                symbols.shape[-3:-1] != (n, n)
                or symbols.dim() not in (3, 4)
                or (symbols.dim() == 4 and symbols.shape[0] != b)
            ):
                raise ValueError(
                    f"symbols {tuple(symbols.shape)}: use_relative_positional_symbols=True takes "
                    f"pairwise symbols (N, N, d_model) = ({n}, {n}, {width}) or (B, N, N, "
                    f"d_model), or the RelativeSymbols of a position_relative retriever"
                )
            pairs = "... n m (h d) -> ... h n m d"
            return {"v_pair": rearrange(self.wv(symbols), pairs, h=self.n_kv_heads)}
        if symbols.shape[:2] != x.shape[:2] or symbols.dim() != 3:
            raise ValueError(
                f"symbols {tuple(symbols.shape)} must be (B, N, d_model) like x {tuple(x.shape)}"
            )
        return {"v": rearrange(self.wv(symbols), "b n (h d) -> b h n d", h=self.n_kv_heads)}

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols: torch.Tensor | RelativeSymbols | None = None,  # see the module docstring
        attn_mask: torch.Tensor | None = None,  # bool or additive, broadcastable to (B,H,N,N)
        is_causal: bool = False,
        rope: Rotary | None = None,  # RoPE on the attention queries and keys
        cache: LayerCache | None = None,  # cached decoding: k, kr, v of the positions before x
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, n_heads * head_dim); with returns="reference" the reference's tuple
        (output, attention (B, H, N, N), relations (B, N, N, R)); with a cache the new
        positions' (attention and relations (.., N, M) over every cached key)."""
        reference = self.returns == "reference"
        out, maps = self.attend(x, symbols, attn_mask, is_causal, rope, reference, cache)
        return out if maps is None else (out, *maps)

    def attend(
        self,
        x: torch.Tensor,
        symbols: torch.Tensor | RelativeSymbols | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rope: Rotary | None = None,
        with_maps: bool = False,
        cache: LayerCache | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(output, None), or with_maps: (output, (attention (B, H, N, N), relations
        (B, N, N, R))), the reference's returns: materialised from this pass's projections,
        differentiable, attention after dropout. When dropout acts (training, dropout > 0)
        the output is then computed from those very weights (materialised); otherwise by the
        backend's kernel."""
        q, k, qr, kr = self.projections(x, rope)
        values = self.symbol_values(x, symbols, 0 if cache is None else cache.length)
        if cache is not None:
            k, kr, values = self.extend_cache(cache, k, kr, values)
        dropout_p = self.dropout if self.training else 0.0
        scale, rel_scale = self.head_dim**-0.5, self.rel_proj_dim**-0.5
        maps = None
        if with_maps:
            attn, relations = self.materialised(q, k, qr, kr, values, attn_mask, is_causal)
            if dropout_p > 0:
                attn = F.dropout(attn, dropout_p)
                out = aggregate(attn, relations, **values).to(q.dtype)
            maps = attn.to(q.dtype), rearrange(relations, "b r n m -> b n m r").to(q.dtype)
        if not with_maps or dropout_p == 0:
            out = relational_attention(
                q, k, qr, kr,
                **values,
                attn_mask=attn_mask,
                is_causal=is_causal,
                scale=scale,
                rel_scale=rel_scale,
                rel_activation=self.rel_activation,
                dropout_p=dropout_p,
                backend=self.backend,
            )  # fmt: skip
        sym, rel = out[..., : self.head_dim], out[..., self.head_dim :]
        heads = sym + einsum(rel, self.wr, "b h n r, h e r -> b h n e")
        return self.resid_dropout(self.wo(rearrange(heads, "b h n d -> b n (h d)"))), maps

    def extend_cache(
        self, cache: LayerCache, k: torch.Tensor, kr: torch.Tensor, values: dict
    ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The new positions' k, kr and symbol values appended to the cache: every cached
        position's (k, kr, values) for the new queries, the cache advanced."""
        n = k.shape[2]
        if "v_pair" in values:
            raise ValueError(
                "dense pairwise symbols cannot be cached (they cover the new positions only): "
                "use the RelativeSymbols of a position_relative retriever"
            )
        if "v" in values:
            k, kr, v = cache.append(k=k, kr=kr, v=values["v"])
            cache.advance(n)
            return k, kr, {"v": v}
        k, kr = cache.append(k=k, kr=kr)
        cache.advance(n)
        m, table = k.shape[2], values["v_rel"]  # (Hkv, 2K+1, hd)
        if m == n:  # no positions before these: the kernel reads the table itself
            return k, kr, values
        index = relative_index(n, m, (table.shape[1] - 1) // 2, table.device, offset=m - n)
        if n == 1:  # one query: each key's value is fixed, absolute values serve every backend
            return k, kr, {"v": table[:, index[0]].expand(k.shape[0], -1, -1, -1)}
        return k, kr, {"v_pair": table[:, index]}  # (Hkv, N, M, hd)

    def projections(self, x: torch.Tensor, rope: Rotary | None) -> tuple[torch.Tensor, ...]:
        """Attention q (B, H, N, dk), k (B, Hkv, N, dk) (RoPE if given) and relation qr, kr
        (B, R, N, dr)."""
        q = rearrange(self.wq_attn(x), "b n (h d) -> b h n d", h=self.n_heads)
        k = rearrange(self.wk_attn(x), "b n (h d) -> b h n d", h=self.n_kv_heads)
        if rope is not None:
            q, k = rope.apply(q), rope.apply(k)
        qr = rearrange(self.wq_rel(x), "b n (r d) -> b r n d", r=self.n_relations)
        kr = rearrange(self.wk_rel(x), "b n (r d) -> b r n d", r=self.n_relations)
        return q, k, qr, kr

    @torch.no_grad()
    def attention_maps(
        self,
        x: torch.Tensor,
        symbols: torch.Tensor | RelativeSymbols | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rope: Rotary | None = None,
        cache: LayerCache | None = None,
    ) -> dict[str, torch.Tensor]:
        """The forward pass's attention weights and relations, materialised:
        {"attention": (B, H, N, N), "relations": (B, R, N, N)}."""
        if cache is not None:
            raise ValueError("attention maps are recorded from uncached calls only (cache=None)")
        q, k, qr, kr = self.projections(x, rope)
        values = self.symbol_values(x, symbols)
        attn, relations = self.materialised(q, k, qr, kr, values, attn_mask, is_causal)
        return {"attention": attn, "relations": relations}

    def materialised(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        qr: torch.Tensor,
        kr: torch.Tensor,
        values: dict,
        attn_mask: torch.Tensor | None,
        is_causal: bool | str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention a (B, H, N, M) and relations r (B, R, N, M) of a call, materialised
        (float32 or wider), the call checked as the forward's kernel call is (the relational
        family's check_inputs: the mask's dtype and shape, the symbol values `values`)."""
        call = check_inputs(
            q, k, qr, kr, **values, attn_mask=attn_mask, is_causal=is_causal,
            scale=self.head_dim**-0.5, rel_scale=self.rel_proj_dim**-0.5,
            rel_activation=self.rel_activation,
        )  # fmt: skip
        attn = attention_tensor(q, k, call["attn_mask"], call["is_causal"], call["scale"])
        return attn, relation_tensor(qr, kr, call["rel_scale"], self.rel_activation)
