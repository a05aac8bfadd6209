"""Standard multi-head softmax attention, with grouped-query heads.

    Q = x Wq,  K = x Wk,  V = x Wv   (per head h: Q^h (N, key_dim), K^h, V^h (N, head_dim))
    A^h = softmax(Q^h K^h^T / sqrt(head_dim)) V^h        (kv head of query head h: h // (H/Hkv))
    out = concat_h(A^h) Wo

Kwargs and parameter names follow ``dual_attention.attention.Attention`` (Altabaa & Lafferty):
head_dim = d_model // total_n_heads, key_dim defaults to head_dim, the scale is
1/sqrt(head_dim) even when key_dim differs, and the output width is n_heads * head_dim
(d_model unless the module is one branch of dual attention, where total_n_heads > n_heads).
Dropout acts on the attention weights and on the output, in training only. `score_mod` and
`mask_mod` (a name, a table ``{name = "sliding_window", window = 64}``, or a function; see
attn_zoo/kernels/softmax/mods.py) change the scores and the visible keys on every backend
that serves them (naive, chunked natively; sdpa a mask mod per query tile; others get a mask
mod as a mask). A mask mod that is
a causal mask itself (prefix_lm) replaces a causal call's mask, so its prefix sees itself both
ways (such a layer decodes without a cache: a later token changes what the prefix sees); a
score mod for causal attention only (one-sided ALiBi) is refused in a call that is not causal.
`score_mod="alibi"` (or a table without n_heads) takes the layer's head count.

Cached decoding (`cache`, a `LayerCache`): the keys (after RoPE) and values of every position
seen so far are cached, the kv heads only under GQA; a call computes its new positions' queries,
keys and values, appends the keys and values, and attends with is_causal="bottom_right" (the
caller's: the new queries are the last positions). The rope tables are those of the new
positions.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from attn_zoo.kernels.rotary import Rotary
from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.kernels.softmax.family import check_inputs
from attn_zoo.kernels.softmax.mods import build_mod, mod_name, shift_queries
from attn_zoo.kernels.softmax.naive import attention_weights
from attn_zoo.mechanisms.base import AttentionMechanism, check_dropout, check_int
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.registry import register_mechanism


def check_heads(d_model: int, n_heads: int, n_kv_heads: int | None, total_n_heads: int | None):
    """Validate a head layout; raises ValueError naming the argument and what would be valid."""
    check_int("d_model", d_model)
    check_int("n_heads", n_heads)
    check_int("n_kv_heads", n_kv_heads, optional=True)
    check_int("total_n_heads", total_n_heads, optional=True)
    total = n_heads if total_n_heads is None else total_n_heads
    if n_heads < 1 or total < n_heads:
        raise ValueError(f"n_heads={n_heads}: must be >= 1 and <= total_n_heads={total}")
    if d_model % total:
        raise ValueError(f"d_model={d_model} must be divisible by total_n_heads={total}")
    if n_kv_heads is not None and (n_kv_heads < 1 or n_heads % n_kv_heads):
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")


@register_mechanism("standard")
class StandardAttention(AttentionMechanism):
    kernel_family = "softmax"
    supports_cache = True  # self-attention: k, v

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        key_dim: int | None = None,
        n_kv_heads: int | None = None,
        add_bias_kv: bool = False,
        add_bias_out: bool = False,
        total_n_heads: int | None = None,
        score_mod: object = None,
        mask_mod: object = None,
        backend: str = "auto",
    ):
        check_heads(d_model, n_heads, n_kv_heads, total_n_heads)
        check_int("key_dim", key_dim, optional=True)
        check_dropout(dropout)
        super().__init__(backend)
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.head_dim = d_model // (n_heads if total_n_heads is None else total_n_heads)
        self.key_dim = self.head_dim if key_dim is None else key_dim
        self.dropout = dropout
        self.wq = nn.Linear(d_model, n_heads * self.key_dim, bias=False)
        self.wk = nn.Linear(d_model, self.n_kv_heads * self.key_dim, bias=add_bias_kv)
        self.wv = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=add_bias_kv)
        out_dim = n_heads * self.head_dim
        self.wo = nn.Linear(out_dim, out_dim, bias=add_bias_out)
        self.resid_dropout = nn.Dropout(dropout)
        if score_mod == "alibi":  # the bare name: the layer's heads fill in its n_heads
            score_mod = {"name": "alibi"}
        if isinstance(score_mod, dict) and score_mod.get("name") == "alibi":  # its slopes
            heads = score_mod.get("n_heads", n_heads)
            if heads != n_heads:
                raise ValueError(
                    f"score_mod alibi n_heads={heads!r} but this layer has n_heads={n_heads}: "
                    "ALiBi's slopes depend on the head count (leave n_heads out to use the layer's)"
                )
            score_mod = {**score_mod, "n_heads": n_heads}
        self.score_mod, self.mask_mod = build_mod(score_mod), build_mod(mask_mod)
        if getattr(self.mask_mod, "replaces_causal", False):  # a later token changes what
            self.supports_cache = False  # earlier ones see (prefix_lm's prefix): no cache

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols: torch.Tensor | None = None,  # unused: standard attention reads no symbols
        attn_mask: torch.Tensor | None = None,  # bool, broadcastable to (B, H, N, N)
        is_causal: bool = False,
        rope: Rotary | None = None,  # RoPE on queries and keys
        context: torch.Tensor | None = None,  # (B, M, d_model): cross-attention keys/values
        cache: LayerCache | None = None,  # cached decoding: k, v of the positions before x
    ) -> torch.Tensor:  # (B, N, n_heads * head_dim)
        if cache is not None and context is not None:
            raise ValueError("the cache is for self-attention: pass context=None with a cache")
        if cache is not None and not self.supports_cache:
            raise ValueError(
                f"mask_mod {mod_name(self.mask_mod)} opens the causal mask (a prefix sees later "
                "positions), so a later token changes earlier ones: no cached decoding (cache=None)"
            )
        is_causal = self.kernel_causality(is_causal)
        source = x if context is None else context
        q, k = self.queries_keys(x, source, rope)
        v = rearrange(self.wv(source), "b n (h d) -> b h n d", h=self.n_kv_heads)
        if cache is not None:
            k, v = cache.append(k=k, v=v)
            cache.advance(x.shape[1])
        offset = k.shape[2] - q.shape[2] if cache is not None else 0  # new queries come last
        out = softmax_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            is_causal=is_causal,
            scale=self.head_dim**-0.5,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            score_mod=shift_queries(self.score_mod, offset, score=True),
            mask_mod=shift_queries(self.mask_mod, offset, score=False),
        )
        return self.resid_dropout(self.wo(rearrange(out, "b h n d -> b n (h d)")))

    def kernel_causality(self, is_causal: bool | str) -> bool | str:
        """The is_causal the kernel gets: False under a mask mod that is a causal mask itself
        (`replaces_causal`: prefix_lm, whose prefix then sees itself both ways); a score mod for
        causal attention only (`causal_only`: one-sided ALiBi) is refused where the call is not
        causal."""
        opened = is_causal and getattr(self.mask_mod, "replaces_causal", False)
        causal = False if opened else is_causal
        reason = getattr(self.score_mod, "causal_only", None)
        if reason is not None and not causal:
            why = (
                f"mask_mod {mod_name(self.mask_mod)} replaces its causal mask"
                if opened
                else f"is_causal={is_causal!r}"
            )
            raise ValueError(
                f"score_mod {mod_name(self.score_mod)} is for causal attention only, and this "
                f"call is not causal ({why}): {reason}"
            )
        return causal

    def absolute_positions(self) -> str | None:
        """The layer's mods that read absolute positions (not declaring `relative`:
        attn_zoo/kernels/softmax/mods.py), named; None where its positions are read only as
        i - j (RoPE, a sliding window, ALiBi) or not at all."""
        mods = (("score_mod", self.score_mod), ("mask_mod", self.mask_mod))
        absolute = [
            f"{kind} {mod_name(mod)}"
            for kind, mod in mods
            if mod is not None and not getattr(mod, "relative", False)
        ]
        return " and ".join(absolute) or None

    def queries_keys(
        self, x: torch.Tensor, source: torch.Tensor, rope: Rotary | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, H, N, dk) from x and k (B, Hkv, M, dk) from source, with RoPE if given."""
        q = rearrange(self.wq(x), "b n (h d) -> b h n d", h=self.n_heads)
        k = rearrange(self.wk(source), "b n (h d) -> b h n d", h=self.n_kv_heads)
        if rope is not None:
            q, k = rope.apply(q), rope.apply(k)
        return q, k

    def weights_and_values(
        self,
        x: torch.Tensor,
        source: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool | str,
        rope: Rotary | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights softmax(q k^T / sqrt(head_dim)) (B, H, N, M) materialised (float32 or
        wider; score and mask mods applied) and the values v (B, Hkv, M, head_dim), queries from
        x, keys and values from source; the call checked as the forward's kernel call is (the
        softmax family's check_inputs: the mask's dtype and shape, the mods pointwise)."""
        q, k = self.queries_keys(x, source, rope)
        v = rearrange(self.wv(source), "b n (h d) -> b h n d", h=self.n_kv_heads)
        call = check_inputs(
            q, k, v, attn_mask, self.kernel_causality(is_causal), self.head_dim**-0.5,
            score_mod=self.score_mod, mask_mod=self.mask_mod,
        )  # fmt: skip
        weights = attention_weights(
            q, k, call["attn_mask"], call["is_causal"], call["scale"], self.score_mod, self.mask_mod
        )
        return weights, v

    @torch.no_grad()
    def attention_maps(
        self,
        x: torch.Tensor,
        symbols: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rope: Rotary | None = None,
        context: torch.Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> dict[str, torch.Tensor]:
        """The forward pass's attention weights, materialised (score and mask mods applied):
        {"attention": (B, H, N, M)}."""
        if cache is not None:
            raise ValueError("attention maps are recorded from uncached calls only (cache=None)")
        source = x if context is None else context
        return {"attention": self.weights_and_values(x, source, attn_mask, is_causal, rope)[0]}
