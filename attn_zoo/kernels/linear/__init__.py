"""The linear attention kernel family (Katharopoulos et al. 2020, feature map elu(x) + 1).

    linear_attention(q, k, v, attn_mask=None, is_causal=False, backend="auto") -> (B, H, N, dv)

Inputs: family.py. A row with no allowed key gives zeros. There is no scale: it would cancel
in the normalisation. Backends: ``naive`` (quadratic, any mask) and ``chunked`` (chunkwise
recurrent, O(N); masks that depend on the key only, shape (B, H, 1, M), such as padding).
"""

import torch

from attn_zoo.kernels.linear import chunked, naive  # noqa: F401 (each registers its backend)
from attn_zoo.kernels.linear.family import LINEAR, describe_call, mask_features
from attn_zoo.kernels.linear.naive import elu_feature_map


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    """Linear attention by the named backend (see module docstring); (B, H, N, dv)."""
    return LINEAR(backend, q=q, k=k, v=v, attn_mask=attn_mask, is_causal=is_causal)


__all__ = ["LINEAR", "describe_call", "elu_feature_map", "linear_attention", "mask_features"]
