"""The sigmoid attention kernel family (Ramapuram et al. 2024, arXiv 2409.04431).

    sigmoid_attention(q, k, v, attn_mask=None, is_causal=False, scale=None, bias=0.0,
                      backend="auto") -> (B, H, N, dv)

out_i = sum_j sigmoid(scale q_i.k_j + bias) v_j over allowed keys (a masked key contributes
0). Inputs: family.py. Backends, each registering itself in its own file: naive (the ground
truth, O(N M) memory) and chunked (tiles of keys accumulated, O(N) memory, any mask).
"""

import torch

from attn_zoo.kernels.sigmoid import chunked, naive  # noqa: F401 (each registers its backend)
from attn_zoo.kernels.sigmoid.family import SIGMOID, describe_call
from attn_zoo.kernels.sigmoid.naive import sigmoid_weights


def sigmoid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    bias: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Sigmoid attention by the named backend (see module docstring); (B, H, N, dv)."""
    return SIGMOID(
        backend, q=q, k=k, v=v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, bias=bias
    )


__all__ = ["SIGMOID", "describe_call", "sigmoid_attention", "sigmoid_weights"]
