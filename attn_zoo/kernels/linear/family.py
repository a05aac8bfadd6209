"""The linear kernel family: its inputs, the call they make, the features backends declare.

    q (B, H, N, dk), k (B, Hkv, M, dk), v (B, Hkv, M, dv), H a multiple of Hkv; attn_mask
    boolean (True = may attend) or float (there are no scores to add it to: its -inf entries
    mask, the rest allow) broadcastable to (B, H, N, M); causal alignment as in masks.py.

Features (`describe_call`): ``grad``, ``causal``, ``dv_ne_dk``, ``gqa``, ``key_mask`` (a mask
that is the same for every query, shape (B, H, 1, M) or expanded from it with stride 0, e.g.
padding) and ``mask`` (any other).
"""

import torch

from attn_zoo.kernels.dispatch import Call, define_family
from attn_zoo.kernels.softmax.family import check_qkv
from attn_zoo.kernels.softmax.masks import align_causal, as_boolean

FEATURES = frozenset({"grad", "mask", "key_mask", "causal", "dv_ne_dk", "gqa"})


def mask_features(attn_mask: torch.Tensor | None) -> dict[str, bool]:
    """``key_mask`` for a mask that is the same for every query: its query dimension of size
    1, or expanded with stride 0 (a padding mask as models pass it); ``mask`` for any other."""
    per_key = attn_mask is not None and (
        attn_mask.dim() < 2 or attn_mask.shape[-2] == 1 or attn_mask.stride(-2) == 0
    )
    return {"key_mask": per_key, "mask": attn_mask is not None and not per_key}


def check_inputs(q, k, v, attn_mask=None, is_causal=False) -> dict:
    """The call's keyword arguments, validated, with the mask viewed as 4-D."""
    mask = as_boolean(check_qkv(q, k, v, attn_mask, 0.0))
    mask, is_causal = align_causal(mask, is_causal, q.shape[2], k.shape[2], q.device)
    return dict(q=q, k=k, v=v, attn_mask=mask, is_causal=is_causal)


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


LINEAR = define_family("linear", check_inputs, describe_call)
