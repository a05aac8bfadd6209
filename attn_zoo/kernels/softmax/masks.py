"""Mask conventions shared by the softmax backends.

Masks are boolean, True = may attend, broadcastable to (B, H, N, M). Causal alignment is
top-left: query i may attend key j iff j <= i (as torch SDPA's ``is_causal``).
"""

import torch


def causal_mask(n: int, m: int, device: torch.device | str, offset: int = 0) -> torch.Tensor:
    """(n, m) boolean, True where key j <= query i + offset (offset: first query's index)."""
    rows = torch.arange(offset, offset + n, device=device)[:, None]
    return torch.arange(m, device=device)[None, :] <= rows


def allowed_keys(
    attn_mask: torch.Tensor | None, is_causal: bool, n: int, m: int, device: torch.device
) -> torch.Tensor | None:
    """The full boolean mask of a call (attn_mask and the causal mask merged), or None."""
    if not is_causal:
        return attn_mask
    causal = causal_mask(n, m, device)
    return causal if attn_mask is None else attn_mask & causal


def unmask_empty_rows(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Let rows that see no key attend everywhere, so a fused kernel stays finite.

    Returns the new mask and `has_key` (..., N, 1) bool; multiply the kernel's output by
    `has_key` to give those rows the contract's zeros (and zero gradients).
    """
    has_key = mask.any(dim=-1, keepdim=True)
    return mask | ~has_key, has_key
