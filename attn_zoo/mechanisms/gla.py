"""Gated linear attention (Yang et al., "Gated Linear Attention Transformers with
Hardware-Efficient Training", ICML 2024, arXiv 2312.06635): linear attention with a
data-dependent forget gate, an RNN over positions. Per head h (key width dk, value width d):

    q_t, k_t, v_t = x_t Wq, x_t Wk, x_t Wv                    (per head: (dk,), (dk,), (d,))
    alpha_t = sigmoid(x_t Wa1 Wa2 + ba)^(1/tau)                (dk,): low-rank gate, rank 16
    S_t = diag(alpha_t) S_{t-1} + k_t^T v_t,    o_t = q_t S_t / sqrt(dk)
    y_t = concat_h(RMSNorm(o_t) * swish(x_t Wg)) Wo             (output gate)

tau = 16 (the paper's), dk = head_dim / 2 by default (the paper's expand_k = 0.5). Layer
details (no projection biases but the gate's ba, the per-head RMSNorm with one learned weight,
the 1/sqrt(dk) query scale) follow the authors' flash-linear-attention
(`fla.layers.GatedLinearAttention` with its defaults). Reference: the kernel is tested against
`fla.ops.gla.naive.naive_recurrent_gla` when flash-linear-attention is installed.

Causal only (`causal_only`): the recurrence reads positions in order, so a non-causal call, an
attn_mask, RoPE or symbols are refused with a clear error. Use it in a LanguageModel, or as a
Seq2Seq's decoder_attention with another encoder_attention (the encoder reads its source both
ways); not in an encoder or a classifier.
Backends (kernel family ``gla``, attn_zoo/kernels/gla/): ``naive`` (the recurrence, the ground
truth) and ``chunked`` (chunk-parallel, O(N) memory).

Cached decoding (`cache`, a `LayerCache`): the recurrent state S (B, H, dk, d), O(1) per layer
whatever the length. Each call runs the kernel from the cached state (its `initial_state`)
and replaces it by the state after its positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from attn_zoo.kernels.gla import decayed_state, gla_attention
from attn_zoo.kernels.rotary import Rotary
from attn_zoo.kernels.softmax.masks import causal_alignment
from attn_zoo.mechanisms.base import AttentionMechanism, check_int
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.registry import register_mechanism
from attn_zoo.mechanisms.standard import check_heads


@register_mechanism("gla")
class GatedLinearAttention(AttentionMechanism):
    """Multi-head gated linear attention; head_dim = d_model // n_heads, causal only."""

    kernel_family = "gla"
    causal_only = True
    supports_cache = True  # the recurrent state S

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        key_dim: int | None = None,
        gate_rank: int = 16,
        tau: float = 16.0,
        backend: str = "auto",
    ):
        check_heads(d_model, n_heads, None, None)
        check_int("key_dim", key_dim, optional=True)
        check_int("gate_rank", gate_rank)
        number = isinstance(tau, int | float) and not isinstance(tau, bool)
        if not (number and math.isfinite(tau) and tau > 0):
            raise ValueError(f"tau={tau!r}: must be a positive number (alpha = sigmoid(.)^(1/tau))")
        super().__init__(backend)
        self.n_heads, self.tau = n_heads, tau
        self.head_dim = d_model // n_heads
        self.key_dim = max(1, self.head_dim // 2) if key_dim is None else key_dim
        width, value_width = n_heads * self.key_dim, n_heads * self.head_dim
        self.wq = nn.Linear(d_model, width, bias=False)
        self.wk = nn.Linear(d_model, width, bias=False)
        self.wv = nn.Linear(d_model, value_width, bias=False)
        self.gate = nn.Sequential(  # Wa1 (d_model, rank), Wa2 (rank, H dk) and ba
            nn.Linear(d_model, gate_rank, bias=False), nn.Linear(gate_rank, width)
        )
        self.wg = nn.Linear(d_model, value_width, bias=False)
        self.norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        self.wo = nn.Linear(value_width, d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # (B, N, d_model)
        symbols: torch.Tensor | None = None,  # must be None
        attn_mask: torch.Tensor | None = None,  # must be None
        is_causal: bool | str = False,  # must be causal (True or "bottom_right")
        rope: Rotary | None = None,  # must be None (accepted for the block's uniform call)
        cache: LayerCache | None = None,  # cached decoding: the state S of the positions before
    ) -> torch.Tensor:  # (B, N, d_model)
        self.check_call(symbols, attn_mask, is_causal, rope)
        q = rearrange(self.wq(x), "b n (h d) -> b h n d", h=self.n_heads)
        k = rearrange(self.wk(x), "b n (h d) -> b h n d", h=self.n_heads)
        v = rearrange(self.wv(x), "b n (h d) -> b h n d", h=self.n_heads)
        log_alpha = F.logsigmoid(self.gate(x)) / self.tau  # log of sigmoid(.)^(1/tau)
        log_alpha = rearrange(log_alpha, "b n (h d) -> b h n d", h=self.n_heads)
        state = None if cache is None else cache.state.get("S")
        out = gla_attention(q, k, v, log_alpha, initial_state=state, backend=self.backend)
        if cache is not None:
            cache.state["S"] = decayed_state(k, v, log_alpha, state)
            cache.advance(x.shape[1])
        gated = self.norm(out) * F.silu(
            rearrange(self.wg(x), "b n (h d) -> b h n d", h=self.n_heads)
        )
        return self.wo(rearrange(gated, "b h n d -> b n (h d)"))

    @staticmethod
    def check_call(symbols, attn_mask, is_causal, rope) -> None:
        """ValueError for what the recurrence cannot serve, naming the argument."""
        if causal_alignment(is_causal) is None:
            raise ValueError(
                f"gla attention is causal only (a recurrence over positions), got "
                f"is_causal={is_causal!r}: use it where blocks are causal, in a LanguageModel "
                "or as a Seq2Seq's decoder_attention with another encoder_attention (its "
                "encoder reads the source both ways), not in an encoder or a classifier"
            )
        if attn_mask is not None:
            raise ValueError(
                "gla attention takes no attn_mask: its recurrence reads every earlier position "
                "(pass attn_mask=None)"
            )
        if rope is not None:
            raise ValueError(
                "gla attention does not support rope (its decay gates carry the order); pass "
                "rope=None and use learned or sinusoidal positions, or none"
            )
        if symbols is not None:
            raise ValueError("gla attention reads no symbols: pass symbols=None")
