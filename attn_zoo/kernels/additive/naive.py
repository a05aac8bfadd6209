"""Additive attention, materialised: the ground truth (Fastformer, Wu et al. 2021,
arXiv 2108.09084).

Per head, with scoring vectors w_q, w_k (d,) and scale s (default 1/sqrt(d)), each query row t
pools the keys it may attend (allowed(t, i): mask and top-left causal alignment as in the
softmax family):

    alpha_ti = softmax_{i allowed}(s <w_q, q_i>)         gq_t = sum_i alpha_ti q_i   global query
    p_i = gq_i * k_i                                      (elementwise; p_i uses row i's gq)
    beta_ti  = softmax_{i allowed}(s <w_k, p_i>)          gk_t = sum_i beta_ti p_i    global key
    u_t = gk_t * v_t                                      (elementwise)

and the kernel returns u (B, H, N, d). Without a mask every row pools all N positions (the
paper's form: one global query and key per sequence); causal, row t pools positions <= t (the
language-model form). A row with no allowed key gives zeros. This form builds the (N, N)
weights: memory O(B H N^2); the scan backend is O(N). Half precision is computed in float32.
"""

import torch
from einops import einsum, repeat

from attn_zoo.kernels.additive.family import FEATURES
from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.softmax.masks import allowed_keys
from attn_zoo.kernels.softmax.naive import masked_softmax, upcast_half


def pool(scores: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor | None):
    """sum_i softmax_{i allowed(t, i)}(scores_i) values_i for every row t: (B, H, N, d).

    scores (B, H, N), values (B, H, N, d), allowed broadcastable to (B, H, N, N) or None."""
    rows = repeat(scores, "b h i -> b h t i", t=scores.shape[-1])
    return einsum(masked_softmax(rows, allowed), values, "b h t i, b h i d -> b h t d")


@register_backend(
    "additive", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES)
)
def naive(
    q: torch.Tensor,  # (B, H, N, d)
    k: torch.Tensor,  # (B, H, N, d)
    v: torch.Tensor,  # (B, H, N, d)
    wq: torch.Tensor,  # (H, d) query scoring vectors
    wk: torch.Tensor,  # (H, d) key scoring vectors
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:  # (B, H, N, d)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype, n = q.dtype, q.shape[2]
    q, k, v, wq, wk = (upcast_half(t) for t in (q, k, v, wq, wk))
    allowed = allowed_keys(attn_mask, is_causal, n, n, q.device)
    global_query = pool(einsum(q, wq, "b h n d, h d -> b h n") * scale, q, allowed)
    p = global_query * k
    global_key = pool(einsum(p, wk, "b h n d, h d -> b h n") * scale, p, allowed)
    return (global_key * v).to(dtype)
