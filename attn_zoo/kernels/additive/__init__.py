"""The additive attention kernel family (Fastformer, Wu et al. 2021, arXiv 2108.09084).

    additive_attention(q, k, v, wq, wk, attn_mask=None, is_causal=False, scale=None,
                       backend="auto") -> (B, H, N, d)

Inputs: family.py; scale defaults to 1/sqrt(d). Returns u_t = gk_t * v_t, the global key
(pooled from p_i = gq_i * k_i, gq the pooled global query) times the value; see naive.py for
the math. Row t pools positions <= t when causal; a row with no allowed key gives zeros.

Backends: ``naive`` (quadratic, any mask) and ``scan`` (tier ``chunked``: prefix scans, O(N);
masks that depend on the key only, shape (B, H, 1, N), such as padding).
"""

import torch

from attn_zoo.kernels.additive import naive, scan  # noqa: F401 (each registers its backend)
from attn_zoo.kernels.additive.family import ADDITIVE, describe_call


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
    return ADDITIVE(
        backend, q=q, k=k, v=v, wq=wq, wk=wk, attn_mask=attn_mask, is_causal=is_causal,
        scale=scale,
    )  # fmt: skip


__all__ = ["ADDITIVE", "additive_attention", "describe_call"]
