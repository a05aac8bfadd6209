"""The relational attention kernel family (Altabaa & Lafferty, arXiv 2405.16727).

    relational_attention(q, k, qr, kr, v=None, v_rel=None, v_pair=None, attn_mask=None,
                         is_causal=False, scale=None, rel_scale=None, rel_activation="identity",
                         dropout_p=0.0, backend="auto") -> (B, H, N, hd + R)

The result holds the attended symbols (hd) and the attended relations (R) of each head; see
naive.py for the math and family.py for the inputs. Symbol values are absolute (v), relative
(v_rel) or pairwise (v_pair, the reference's dense (N, N, d_model) symbols projected). Masks,
causal alignment and empty rows follow the softmax family; no keys (M = 0) gives zeros and no
queries (N = 0) an empty result. Backends, each registering itself in its own file: naive,
chunked (tiled, O(N) memory), cpp (fused C++ on CPU), sdpa (value augmentation on torch
SDPA), triton; only naive and chunked read v_pair.
"""

import torch

from attn_zoo.kernels.relational import (  # noqa: F401 (each registers its backend)
    chunked,
    cpp,
    naive,
    triton,
    value_augmentation,
)
from attn_zoo.kernels.relational.family import RELATIONAL, describe_call


def relational_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    qr: torch.Tensor,
    kr: torch.Tensor,
    v: torch.Tensor | None = None,
    v_rel: torch.Tensor | None = None,
    v_pair: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    rel_scale: float | None = None,
    rel_activation: str = "identity",
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Relational attention by the named backend (see module docstring); (B, H, N, hd + R)."""
    return RELATIONAL(
        backend, q=q, k=k, qr=qr, kr=kr, v=v, v_rel=v_rel, v_pair=v_pair, attn_mask=attn_mask,
        is_causal=is_causal, scale=scale, rel_scale=rel_scale, rel_activation=rel_activation,
        dropout_p=dropout_p,
    )  # fmt: skip


__all__ = ["RELATIONAL", "describe_call", "relational_attention"]
