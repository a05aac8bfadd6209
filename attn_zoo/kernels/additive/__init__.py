"""The additive attention kernel family (Fastformer, Wu et al. 2021, arXiv 2108.09084).

    additive_attention(q, k, v, wq, wk, attn_mask=None, is_causal=False, scale=None,
                       backend="auto") -> (B, H, N, d)

with q, k, v (B, H, N, d) from one sequence (self-attention: keys are the queries' positions),
wq, wk (H, d) the per-head scoring vectors of the query and key pooling, scale defaulting to
1/sqrt(d). Returns u_t = gk_t * v_t, the global key (pooled from p_i = gq_i * k_i, gq the pooled
global query) times the value; see naive.py for the math. attn_mask boolean (True = may
attend) broadcastable to (B, H, N, N); causal alignment top-left (row t pools positions <= t);
a row with no allowed key gives zeros.

Backends: ``naive`` (quadratic, any mask) and ``scan`` (tier ``chunked``: prefix scans, O(N);
masks that depend on the key only, shape (B, H, 1, N), such as padding).
"""

import torch

from attn_zoo.kernels.additive.naive import naive
from attn_zoo.kernels.additive.scan import scan
from attn_zoo.kernels.dispatch import Call, Capabilities, family, register_backend
from attn_zoo.kernels.linear import mask_features
from attn_zoo.kernels.softmax import check_mask

FEATURES = frozenset({"grad", "mask", "key_mask", "causal"})

ADDITIVE = family("additive")
register_backend(
    "additive", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES)
)(naive)
register_backend(
    "additive",
    "scan",
    tier="chunked",
    priority=10,
    capabilities=Capabilities(
        FEATURES - {"mask"},
        why={
            "mask": "the scan pools each prefix once for all queries, so it serves only masks "
            "that do not depend on the query (shape (B, H, 1, N), e.g. padding); use 'naive'"
        },
    ),
)(scan)


def _check_inputs(q, k, v, wq, wk) -> None:
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


def describe_call(q, k, v, wq, wk, attn_mask=None, is_causal=False, scale=None) -> Call:
    """The `Call` an additive attention call makes (for backend choice)."""
    needs = {
        "grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, wq, wk)),
        "causal": is_causal,
        **mask_features(attn_mask),
    }
    return Call(q.device.type, q.dtype, frozenset(f for f, used in needs.items() if used))


def additive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Additive attention by the named backend (see module docstring); (B, H, N, d)."""
    _check_inputs(q, k, v, wq, wk)
    mask = check_mask(attn_mask, q, k)
    chosen = ADDITIVE.select(backend, describe_call(q, k, v, wq, wk, mask, is_causal, scale))
    return chosen.fn(q, k, v, wq, wk, attn_mask=mask, is_causal=is_causal, scale=scale)


ADDITIVE.describe = describe_call

__all__ = ["ADDITIVE", "additive_attention", "describe_call"]
