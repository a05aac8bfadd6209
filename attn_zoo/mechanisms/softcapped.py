"""Softcapped attention (Gemma Team, "Gemma 2: Improving Open Language Models at a Practical
Size", arXiv 2408.00118): standard attention whose scores are capped smoothly before the
softmax,

    s_ij = cap * tanh((q_i . k_j / sqrt(d)) / cap)           (cap = 50, Gemma 2's)

so no logit exceeds |cap| while small ones pass nearly unchanged. It is `StandardAttention`
with the ``softcap`` score mod (attn_zoo/kernels/softmax/mods.py): everything else (heads,
grouped queries, RoPE, masks and mask mods, dropout, cross-attention, cached decoding,
attention maps) is standard attention's. The backends are those of the softmax family that
apply score mods themselves: naive, chunked (O(N) memory) and flex (CUDA), and the tiers they
make usable; sdpa and xformers take no score mod and are not offered. `backend_status`
answers for a call with the score mod (the fused tier has none on CPU). Reference: the tests
check it against the Gemma 2 attention function of Hugging Face transformers
(`eager_attention_forward` with `softcap`).
"""

from __future__ import annotations

from attn_zoo.kernels.dispatch import TIERS, family
from attn_zoo.kernels.softmax.mods import softcap
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import StandardAttention


@register_mechanism("softcapped")
class SoftcappedAttention(StandardAttention):
    """Standard attention with scores softcapped at `cap` (Gemma 2)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        cap: float = 50.0,
        dropout: float = 0.0,
        key_dim: int | None = None,
        n_kv_heads: int | None = None,
        add_bias_kv: bool = False,
        add_bias_out: bool = False,
        total_n_heads: int | None = None,
        mask_mod: object = None,
        backend: str = "auto",
    ):
        super().__init__(
            d_model, n_heads, dropout=dropout, key_dim=key_dim, n_kv_heads=n_kv_heads,
            add_bias_kv=add_bias_kv, add_bias_out=add_bias_out, total_n_heads=total_n_heads,
            score_mod=softcap(cap), mask_mod=mask_mod, backend=backend,
        )  # fmt: skip
        self.cap = cap

    @classmethod
    def backend_names(cls) -> list[str]:
        """The softmax backends that take a score mod, and the tiers they make usable."""
        softmax = family(cls.kernel_family)
        names = [
            name
            for name in softmax.names()
            if name in softmax.backends
            and "score_mod" in softmax.backends[name].capabilities.features
        ]
        tiers = {softmax.backends[name].tier for name in names}
        return names + [t for t in TIERS if t in tiers and t not in names]

    @classmethod
    def backend_status(cls, backend: str, device: str = "cpu") -> tuple[bool, str]:
        """(ok, reason): can `backend` run this mechanism's plain float32 calls, each with its
        score mod, on `device`? (The fused tier on CPU cannot: sdpa takes no score mod.)"""
        cls.check_backend(backend)
        return family(cls.kernel_family).status(backend, device, frozenset({"score_mod"}))

    def extra_repr(self) -> str:
        return f"cap={self.cap}, {super().extra_repr()}"
