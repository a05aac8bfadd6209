"""The additive kernel family: its inputs, the call they make, the features backends declare.

    q, k, v (B, H, N, d) from one sequence (self-attention: keys are the queries' positions);
    wq, wk (H, d) the per-head scoring vectors of the query and key pooling; attn_mask boolean
    (True = may attend) broadcastable to (B, H, N, N); causal alignment top-left.

Features (`describe_call`): ``grad``, ``causal``, ``key_mask`` (a mask the same for every
query, shape (B, H, 1, N), e.g. padding) and ``mask`` (any other).
"""

import torch

from attn_zoo.kernels.dispatch import Call, define_family
from attn_zoo.kernels.linear.family import mask_features
from attn_zoo.kernels.softmax.family import check_mask
from attn_zoo.kernels.softmax.masks import align_causal, as_boolean

FEATURES = frozenset({"grad", "mask", "key_mask", "causal"})


def check_inputs(q, k, v, wq, wk, attn_mask=None, is_causal=False, scale=None) -> dict:
    """The call's keyword arguments, validated, with the mask viewed as 4-D."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4 or t.shape != q.shape:
            raise ValueError(
                f"{name} {tuple(t.shape)}: q, k and v must all be (B, H, N, d), "
                f"like q {tuple(q.shape)} (additive attention multiplies them elementwise)"
            )
    for name, t in (("q", q), ("k", k), ("v", v), ("wq", wq), ("wk", wk)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; q is {q.dtype} on {q.device}")
    for name, t in (("wq", wq), ("wk", wk)):
        if t.shape != (q.shape[1], q.shape[3]):
            raise ValueError(f"{name} {tuple(t.shape)} must be (H, d) = {(q.shape[1], q.shape[3])}")
    mask = as_boolean(check_mask(attn_mask, q, k))
    mask, is_causal = align_causal(mask, is_causal, q.shape[2], k.shape[2], q.device)
    return dict(q=q, k=k, v=v, wq=wq, wk=wk, attn_mask=mask, is_causal=is_causal, scale=scale)


def describe_call(q, k, v, wq, wk, attn_mask=None, is_causal=False, scale=None) -> Call:
    """The `Call` an additive attention call makes (for backend choice)."""
    needs = {
        "grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, wq, wk)),
        "causal": is_causal,
        **mask_features(attn_mask),
    }
    return Call(q.device.type, q.dtype, frozenset(f for f, used in needs.items() if used))


ADDITIVE = define_family("additive", check_inputs, describe_call)
