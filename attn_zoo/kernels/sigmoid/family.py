"""The sigmoid kernel family: its inputs, the call they make, the features backends declare.

    q (B, H, N, dk), k (B, Hkv, M, dk), v (B, Hkv, M, dv), H a multiple of Hkv (grouped-query
    heads); attn_mask boolean (True = may attend) or additive float (added to the scores,
    -inf = masked), broadcastable to (B, H, N, M); is_causal False, True (top-left) or
    "bottom_right" (masks.py); scale defaulting to 1/sqrt(dk); bias b, a finite number added
    to every score (Ramapuram et al. use b = -log(n); the mechanism chooses it).

Features a call may need (`describe_call`): ``grad``, ``mask``, ``float_mask``, ``causal``,
``dv_ne_dk``, ``gqa``, as in the softmax family. A bottom-right causal call with N != M is a
``mask`` call; backends declaring ``bottom_right`` (chunked) take it as is, the others as an
explicit mask (masks.lower_bottom_right).
"""

import math

import torch

from attn_zoo.kernels.dispatch import Call, define_family
from attn_zoo.kernels.softmax.family import check_qkv
from attn_zoo.kernels.softmax.masks import is_additive, lower_bottom_right, normal_causality

FEATURES = frozenset({"grad", "mask", "float_mask", "causal", "dv_ne_dk", "gqa"})


def check_inputs(q, k, v, attn_mask=None, is_causal=False, scale=None, bias=0.0) -> dict:
    """The call's keyword arguments, validated, with the mask viewed as 4-D and is_causal
    False, True (top-left) or "bottom_right" (N != M, N > 1)."""
    mask = check_qkv(q, k, v, attn_mask, 0.0)
    if isinstance(bias, bool) or not isinstance(bias, int | float) or not math.isfinite(bias):
        raise ValueError(f"bias={bias!r}: must be a finite number (added to every score)")
    is_causal = normal_causality(is_causal, q.shape[2], k.shape[2])
    return dict(q=q, k=k, v=v, attn_mask=mask, is_causal=is_causal, scale=scale, bias=bias)


def describe_call(q, k, v, attn_mask=None, is_causal=False, scale=None, bias=0.0) -> Call:
    """The `Call` a sigmoid attention call makes (for backend choice)."""
    tensors = (q, k, v) if attn_mask is None else (q, k, v, attn_mask)
    needs = {
        "grad": torch.is_grad_enabled() and any(t.requires_grad for t in tensors),
        "mask": attn_mask is not None or is_causal == "bottom_right",
        "float_mask": is_additive(attn_mask),
        "causal": is_causal is True,
        "dv_ne_dk": v.shape[-1] != k.shape[-1],
        "gqa": k.shape[1] != q.shape[1],
    }
    return Call(q.device.type, q.dtype, frozenset(f for f, used in needs.items() if used))


SIGMOID = define_family("sigmoid", check_inputs, describe_call, lower_bottom_right)
