"""The gated linear attention kernel family (Yang et al. 2024, arXiv 2312.06635).

    gla_attention(q, k, v, log_alpha, initial_state=None, scale=None, backend="auto")
        -> (B, H, N, dv)

S_t = diag(alpha_t) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t, alpha_t = exp(log_alpha_t):
causal by construction. Inputs: family.py. Backends: ``naive`` (the recurrence, one position
at a time: the ground truth) and ``chunked`` (chunk-parallel, O(N) memory). `decayed_state`
gives the state after a call (what a cache keeps between calls).
"""

import torch

from attn_zoo.kernels.gla import chunked, naive  # noqa: F401 (each registers its backend)
from attn_zoo.kernels.gla.chunked import decayed_state
from attn_zoo.kernels.gla.family import GLA, describe_call


def gla_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Gated linear attention by the named backend (see module docstring); (B, H, N, dv)."""
    return GLA(
        backend, q=q, k=k, v=v, log_alpha=log_alpha, initial_state=initial_state, scale=scale
    )


__all__ = ["GLA", "decayed_state", "describe_call", "gla_attention"]
