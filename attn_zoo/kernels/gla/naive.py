"""Gated linear attention, recurrent: the ground truth (Yang et al., "Gated Linear Attention
Transformers with Hardware-Efficient Training", ICML 2024, arXiv 2312.06635, eq. 3).

Per head, a state S (dk, dv) decays row-wise by the gate alpha_t (dk,) and takes in k_t v_t^T:

    S_t = diag(alpha_t) S_{t-1} + k_t^T v_t,     o_t = (scale q_t) S_t      (S_0: initial_state)

one position at a time, as written: O(N dk dv) time, and autograd keeps every S_t. The
chunked backend computes the same outputs chunk-parallel. Half precision runs in float32.
"""

import torch
from einops import einsum

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.gla.family import FEATURES
from attn_zoo.kernels.softmax.naive import upcast_half


@register_backend("gla", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES))
def naive(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, H, N, dk)
    v: torch.Tensor,  # (B, H, N, dv)
    log_alpha: torch.Tensor,  # (B, H, N, dk), <= 0
    initial_state: torch.Tensor | None = None,  # (B, H, dk, dv)
    scale: float | None = None,
) -> torch.Tensor:  # (B, H, N, dv)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = q.dtype
    q, k, v, log_alpha = (upcast_half(t) for t in (q, k, v, log_alpha))
    (b, h, n, dk), dv = q.shape, v.shape[-1]
    state = q.new_zeros(b, h, dk, dv) if initial_state is None else upcast_half(initial_state)
    outputs = [v[:, :, :0]]  # (N = 0)
    for t in range(n):
        state = log_alpha[:, :, t, :, None].exp() * state + einsum(
            k[:, :, t], v[:, :, t], "b h d, b h e -> b h d e"
        )
        outputs.append(einsum(q[:, :, t] * scale, state, "b h d, b h d e -> b h e")[:, :, None])
    return torch.cat(outputs, dim=2).to(dtype)
