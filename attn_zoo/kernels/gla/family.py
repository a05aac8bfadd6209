"""The gated linear attention kernel family: its inputs, the call they make, its features.

    q, k (B, H, N, dk), v (B, H, N, dv), log_alpha (B, H, N, dk): the log of each position's
    forget gate alpha_t in (0, 1], so log_alpha <= 0 (the chunked form relies on it for its
    exponents to stay <= 0); initial_state None or (B, H, dk, dv), the state S_0 before the
    first position (a cache's); scale on the queries, defaulting to 1/sqrt(dk).

Causal by construction (a recurrence over positions): there is no is_causal and no mask.
Features (`describe_call`): ``grad`` and ``dv_ne_dk``; every backend serves both.
"""

import torch

from attn_zoo.kernels.dispatch import Call, define_family

FEATURES = frozenset({"grad", "dv_ne_dk"})


def check_inputs(q, k, v, log_alpha, initial_state=None, scale=None) -> dict:
    """The call's keyword arguments, validated (ValueError naming the bad argument)."""
    tensors = {"q": q, "k": k, "v": v, "log_alpha": log_alpha, "initial_state": initial_state}
    for name, t in tensors.items():
        if t is None and name == "initial_state":
            continue
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor, got {shape}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; q is {q.dtype} on {q.device}")
    (b, h, n, dk), dv = q.shape, v.shape[-1]
    expected = {"k": (b, h, n, dk), "v": (b, h, n, dv), "log_alpha": (b, h, n, dk)}
    if initial_state is not None:
        expected["initial_state"] = (b, h, dk, dv)
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(
                f"{name} {tuple(tensors[name].shape)}: must be {shape} for q {tuple(q.shape)} "
                f"and v {tuple(v.shape)} (q, k, log_alpha (B, H, N, dk), v (B, H, N, dv), "
                "initial_state (B, H, dk, dv))"
            )
    return dict(q=q, k=k, v=v, log_alpha=log_alpha, initial_state=initial_state, scale=scale)


def describe_call(q, k, v, log_alpha, initial_state=None, scale=None) -> Call:
    """The `Call` a gated linear attention call makes (for backend choice)."""
    tensors = [t for t in (q, k, v, log_alpha, initial_state) if t is not None]
    needs = {
        "grad": torch.is_grad_enabled() and any(t.requires_grad for t in tensors),
        "dv_ne_dk": v.shape[-1] != k.shape[-1],
    }
    return Call(q.device.type, q.dtype, frozenset(f for f, used in needs.items() if used))


GLA = define_family("gla", check_inputs, describe_call)
