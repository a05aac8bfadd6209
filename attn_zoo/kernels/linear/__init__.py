"""The linear attention kernel family (Katharopoulos et al. 2020, feature map elu(x) + 1).

    linear_attention(q, k, v, attn_mask=None, is_causal=False, backend="auto") -> (B, H, N, dv)

with q (B, H, N, dk), k (B, Hkv, M, dk), v (B, Hkv, M, dv), H a multiple of Hkv; attn_mask
boolean (True = may attend) broadcastable to (B, H, N, M), causal alignment top-left; a row
with no allowed key gives zeros. There is no scale: it would cancel in the normalisation.

Backends: ``naive`` (quadratic, any mask) and ``chunked`` (chunkwise recurrent, O(N); masks
that depend on the key only, shape (B, H, 1, M), such as padding).
"""

import torch

from attn_zoo.kernels.dispatch import Call, Capabilities, family, register_backend
from attn_zoo.kernels.linear.chunked import chunked
from attn_zoo.kernels.linear.naive import elu_feature_map, naive
from attn_zoo.kernels.softmax import check_qkv

FEATURES = frozenset({"grad", "mask", "key_mask", "causal", "dv_ne_dk", "gqa"})
KEY_MASK_WHY = {
    "mask": "the chunkwise form shares its key sums across queries, so it serves only masks "
    "that do not depend on the query (shape (B, H, 1, M), e.g. padding); use 'naive'"
}

LINEAR = family("linear")
register_backend("linear", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES))(
    naive
)
register_backend(
    "linear",
    "chunked",
    tier="chunked",
    priority=10,
    capabilities=Capabilities(FEATURES - {"mask"}, why=KEY_MASK_WHY),
)(chunked)


def mask_features(attn_mask: torch.Tensor | None) -> dict[str, bool]:
    """``key_mask`` for a 4-D mask that is the same for every query, ``mask`` for any other."""
    per_key = attn_mask is not None and (attn_mask.dim() < 2 or attn_mask.shape[-2] == 1)
    return {"key_mask": per_key, "mask": attn_mask is not None and not per_key}


def describe_call(q, k, v, attn_mask=None, is_causal=False) -> Call:
    """The `Call` a linear attention call makes (for backend choice)."""
    needs = {
        "grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
        "causal": is_causal,
        "dv_ne_dk": v.shape[-1] != k.shape[-1],
        "gqa": k.shape[1] != q.shape[1],
        **mask_features(attn_mask),
    }
    return Call(q.device.type, q.dtype, frozenset(f for f, used in needs.items() if used))


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    """Linear attention by the named backend (see module docstring); (B, H, N, dv)."""
    mask = check_qkv(q, k, v, attn_mask, 0.0)
    chosen = LINEAR.select(backend, describe_call(q, k, v, mask, is_causal))
    return chosen.fn(q, k, v, attn_mask=mask, is_causal=is_causal)


LINEAR.describe = describe_call

__all__ = ["LINEAR", "describe_call", "elu_feature_map", "linear_attention"]
