"""Gated linear attention, chunk-parallel: O(N) memory (Yang et al. 2024, arXiv 2312.06635,
section 4). The same outputs as the recurrence in naive.py.

Positions go in chunks of `chunk`. Inside a chunk, with b_t = sum_{s <= t} log alpha_s (the
cumulative log gate from the chunk's start, (dk,) per position, decreasing) and S the state
before the chunk,

    o_t = scale q_t (exp(b_t) * S)  +  scale sum_{s <= t in chunk} A_ts v_s,
    A_ts = sum_d q_td k_sd exp(b_td - b_sd)                       (s <= t: exponents <= 0)
    S   <- exp(b_last) * S + sum_s (k_s * exp(b_last - b_s))^T v_s   (`decayed_state`)

where * scales S's rows. Every exponent is a difference b_t - b_s with s <= t, never above 0,
so nothing overflows however small the gates (the factorised form q exp(b) . k exp(-b) of the
paper's kernel would need its secondary chunking for that; here the (chunk, chunk, dk) decays
are formed directly). Work O(N (chunk (dk + dv) + dk dv)) per head; memory O(B H chunk^2 dk)
per chunk, and O(N chunk dk) kept by autograd for training. Half precision runs in float32.
"""

import torch
from einops import einsum

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.gla.family import FEATURES
from attn_zoo.kernels.softmax.masks import causal_mask
from attn_zoo.kernels.softmax.naive import upcast_half

CHUNK = 64


def decayed_state(
    k: torch.Tensor,  # (B, H, N, dk)
    v: torch.Tensor,  # (B, H, N, dv)
    log_alpha: torch.Tensor,  # (B, H, N, dk)
    state: torch.Tensor | None = None,  # (B, H, dk, dv): S before the first position
) -> torch.Tensor:  # (B, H, dk, dv)
    """The state S_N after N positions: exp(b_N) * S + sum_s (k_s * exp(b_N - b_s))^T v_s,
    b the cumulative log gate (None: S = 0)."""
    b = log_alpha.cumsum(dim=2)
    total = (
        b[:, :, -1:] if b.shape[2] else b.new_zeros(*b.shape[:2], 1, b.shape[3])
    )  # (B, H, 1, dk)
    new = einsum(k * (total - b).exp(), v, "b h n d, b h n e -> b h d e")
    return new if state is None else total.transpose(-1, -2).exp() * state + new


@register_backend(
    "gla",
    "chunked",
    tier="chunked",
    priority=10,
    capabilities=Capabilities(FEATURES),
    block_sizes=(CHUNK,),
)
def chunked(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, H, N, dk)
    v: torch.Tensor,  # (B, H, N, dv)
    log_alpha: torch.Tensor,  # (B, H, N, dk), <= 0
    initial_state: torch.Tensor | None = None,  # (B, H, dk, dv)
    scale: float | None = None,
    chunk: int = CHUNK,
) -> torch.Tensor:  # (B, H, N, dv)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = q.dtype
    q, k, v, log_alpha = (upcast_half(t) for t in (q, k, v, log_alpha))
    state = None if initial_state is None else upcast_half(initial_state)
    n = q.shape[2]
    outputs = [v[:, :, :0]]  # (N = 0)
    for i0 in range(0, n, chunk):
        i1 = min(i0 + chunk, n)
        qc = q[:, :, i0:i1] * scale
        kc, vc, gc = k[:, :, i0:i1], v[:, :, i0:i1], log_alpha[:, :, i0:i1]
        b = gc.cumsum(dim=2)  # (B, H, C, dk)
        later = ~causal_mask(i1 - i0, i1 - i0, q.device)[..., None]  # (C, C, 1): s > t
        decay = (b[:, :, :, None] - b[:, :, None, :]).masked_fill(later, float("-inf")).exp()
        scores = einsum(qc, kc, decay, "b h t d, b h s d, b h t s d -> b h t s")
        out = einsum(scores, vc, "b h t s, b h s e -> b h t e")
        if state is not None:
            out = out + einsum(qc * b.exp(), state, "b h t d, b h d e -> b h t e")
        outputs.append(out)
        state = decayed_state(kc, vc, gc, state)
    return torch.cat(outputs, dim=2).to(dtype)
