"""Head layout helpers shared by kernel backends."""

import torch
from einops import rearrange, repeat


def repeat_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Grouped-query heads: (B, Hkv, M, d) -> (B, n_heads, M, d); query head h reads kv head
    h // (n_heads // Hkv), as in torch SDPA's ``enable_gqa``."""
    groups = n_heads // x.shape[1]
    if groups == 1:
        return x
    return repeat(x, "b h m d -> b (h g) m d", g=groups)


def group_queries(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """(B, H, N, d) -> (B, Hkv, G, N, d): the query heads that share one kv head, side by side."""
    return rearrange(q, "b (h g) n d -> b h g n d", h=n_kv_heads)
