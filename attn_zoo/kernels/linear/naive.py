"""Linear attention, materialised: the ground truth (Katharopoulos et al. 2020, "Transformers are
RNNs", arXiv 2006.16236).

With the feature map phi(x) = elu(x) + 1 (positive) applied to each query and key vector:

    out_i = sum_j A_ij v_j / sum_j A_ij,     A_ij = <phi(q_i), phi(k_j)>

over allowed keys j only (mask and top-left causal alignment as in the softmax family); a row
with no allowed key gives zeros. This is the quadratic form: memory O(B H N M). The chunked
backend computes the same sums in O(N) memory. Half-precision inputs are computed in float32.
"""

import torch
import torch.nn.functional as F
from einops import einsum

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.linear.family import FEATURES
from attn_zoo.kernels.softmax.masks import allowed_keys
from attn_zoo.kernels.softmax.naive import upcast_half


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1: positive, so every normaliser sum_j A_ij is > 0."""
    return F.elu(x) + 1


def normalise(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """numerator (..., N, dv) / denominator (..., N); rows whose denominator is 0 give zeros."""
    empty = denominator == 0
    return numerator / torch.where(empty, 1.0, denominator)[..., None]


@register_backend("linear", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES))
def naive(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:  # (B, H, N, dv)
    dtype = q.dtype
    q, k, v = (upcast_half(t) for t in (q, k, v))
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    scores = einsum(elu_feature_map(q), elu_feature_map(k), "b h n d, b h m d -> b h n m")
    allowed = allowed_keys(attn_mask, is_causal, q.shape[2], k.shape[2], q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, 0.0)
    numerator = einsum(scores, v, "b h n m, b h m d -> b h n d")
    return normalise(numerator, scores.sum(dim=-1)).to(dtype)
