"""Gated linear attention, chunk-parallel: O(N) memory (Yang et al. 2024, arXiv 2312.06635,
section 4). The same outputs as the recurrence in naive.py.

Positions go in chunks of `chunk`. Inside a chunk, with b_t = sum_{s <= t} log alpha_s (the
cumulative log gate from the chunk's start, (dk,) per position, decreasing) and S the state
before the chunk,

    o_t = scale q_t (exp(b_t) * S)  +  scale sum_{s <= t in chunk} A_ts v_s,
    A_ts = sum_d q_td k_sd exp(G_tsd),   G_ts = sum_{s < r <= t} log alpha_r   (= b_t - b_s)
    S   <- exp(b_last) * S + sum_s (k_s * exp(G_last,s))^T v_s      (`decayed_state`)

where * scales S's rows. Every exponent G_ts sums the gates between s and t, never above 0, so
nothing overflows however small the gates (the factorised form q exp(b) . k exp(-b) of the
paper's kernel would need its secondary chunking for that; here the (chunk, chunk, dk) decays
are formed directly). Each G is summed over its own gates (`gaps`, Mamba-2's "segsum"), not
taken as the difference b_t - b_s: with fast gates (tau = 0.5) b reaches -100 within a chunk,
and the difference of two such float32 sums keeps their absolute rounding error (~1e-5) even
between near positions, whose decays weigh most, where the recurrence errs by t - s roundings
only. Summed so, the kernel stayed within the recurrence's own float32 error (beyond the
testing kit's fixed tolerances: attn_zoo.testing.mechanisms) on all 324 gla layer problems of
a scan (d_model 8 and 16, 1 to 4 heads, key widths 1 to 5, tau 0.5 to 16, N = 63, 65, 130),
where the difference exceeded it on 34 gradients, by up to 11 times; it costs about 1.5 times
the difference's CPU time. Work O(N (chunk (dk + dv) + dk dv)) per head; memory
O(B H chunk^2 dk) per chunk, and O(N chunk dk) kept by autograd for training. Half precision
runs in float32.
"""

import torch
import torch.nn.functional as F
from einops import einsum

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.gla.family import FEATURES
from attn_zoo.kernels.softmax.masks import causal_mask
from attn_zoo.kernels.softmax.naive import upcast_half

# fastest of 8, 16, 32 and 64 on the 2-core CPU, fwd+bwd, one thread, dk = dv = 32, 4 heads (one
# run, medians of 3 on a loaded machine): B 32 x N 128 0.37 s (64: 3.5 s, naive 0.48 s),
# B 1 x N 4,096 1.3 s (64: 2.3 s, naive 6.7 s), B 8 x N 512 0.70 s (64: 3.1 s)
CHUNK = 16


def decayed_state(
    k: torch.Tensor,  # (B, H, N, dk)
    v: torch.Tensor,  # (B, H, N, dv)
    log_alpha: torch.Tensor,  # (B, H, N, dk)
    state: torch.Tensor | None = None,  # (B, H, dk, dv): S before the first position
) -> torch.Tensor:  # (B, H, dk, dv)
    """The state S_N after N positions: exp(b_N) * S + sum_s (k_s * exp(G_Ns))^T v_s, b the
    cumulative log gate, G_Ns = sum_{s < r <= N} log alpha_r summed as such (None: S = 0)."""
    # sums over r >= s, a zero gate appended: (B, H, N + 1, dk)
    suffix = F.pad(log_alpha, (0, 0, 0, 1)).flip(2).cumsum(dim=2).flip(2)
    total, after = suffix[:, :, :1], suffix[:, :, 1:]  # every gate; G_Ns: those after s
    new = einsum(k * after.exp(), v, "b h n d, b h n e -> b h d e")
    return new if state is None else total.transpose(-1, -2).exp() * state + new


def gaps(log_alpha: torch.Tensor) -> torch.Tensor:  # (B, H, C, dk) -> (B, H, C, C, dk)
    """G_ts = sum_{s < r <= t} log alpha_r (t on dim 2, s on dim 3), each summed over its own
    gates (a cumulative sum over r of the gates masked to r > s), -inf for s > t."""
    c = log_alpha.shape[2]
    after_s = causal_mask(c, c, log_alpha.device, offset=-1)[..., None]  # (r, s, 1): r > s
    sums = log_alpha[:, :, :, None].masked_fill(~after_s, 0.0).cumsum(dim=2)
    return sums.masked_fill(~causal_mask(c, c, log_alpha.device)[..., None], float("-inf"))


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
        decay = gaps(gc).exp()  # (B, H, C, C, dk): exp(G_ts), 0 for s > t
        scores = einsum(qc, kc, decay, "b h t d, b h s d, b h t s d -> b h t s")
        out = einsum(scores, vc, "b h t s, b h s e -> b h t e")
        if state is not None:
            out = out + einsum(qc * b.exp(), state, "b h t d, b h d e -> b h t e")
        outputs.append(out)
        state = decayed_state(kc, vc, gc, state)
    return torch.cat(outputs, dim=2).to(dtype)
