"""Mask conventions shared by the backends.

A mask is boolean (True = may attend) or additive float (added to the scores; -inf = masked),
broadcastable to (B, H, N, M). Causal alignment is top-left by default: query i may attend key
j iff j <= i (torch SDPA's ``is_causal``); bottom-right (FlashAttention, KV-cache decoding: the
last query sees the last key) is j <= i + M - N. The kernel families keep a bottom-right call
with N != M as ``is_causal="bottom_right"`` for backends that declare the ``bottom_right``
feature (the chunked kernels: their tiles apply it, O(N) memory) and turn it into an explicit
(N, M) mask for every other backend (`lower_bottom_right`), which then sees top-left
causality only.
"""

from collections.abc import Collection

import torch

ALIGNMENTS = ("top_left", "bottom_right")


def causal_alignment(is_causal: bool | str) -> str | None:
    """None (not causal), "top_left" (is_causal=True) or "bottom_right"; ValueError otherwise."""
    if is_causal is False or is_causal is None:
        return None
    if is_causal is True:
        return "top_left"
    if is_causal in ALIGNMENTS:
        return is_causal
    raise ValueError(
        f"is_causal={is_causal!r}: use False, True (top-left) or one of {', '.join(ALIGNMENTS)}"
    )


def causal_mask(n: int, m: int, device: torch.device | str, offset: int = 0) -> torch.Tensor:
    """(n, m) boolean, True where key j <= query i + offset (offset: first query's index)."""
    rows = torch.arange(offset, offset + n, device=device)[:, None]
    return torch.arange(m, device=device)[None, :] <= rows


def is_additive(mask: torch.Tensor | None) -> bool:
    """True for a float (additive) mask."""
    return mask is not None and mask.dtype != torch.bool


SATURATED = -100.0  # a row whose largest additive mask value is below this is "saturated"


def saturated(mask: torch.Tensor | None) -> bool:
    """True where an additive `mask` has a row whose every key is masked by a finite value
    below `SATURATED` (transformers' float32 min, BERT's -10000): such a row's softmax is that
    of scores shifted by a huge constant, and a kernel keeping only lse = m + log l for its
    backward loses log l beside m (float32: |m| 2^-24 each; 2x the gradient at float32's min).
    Under torch.compile (no data-dependent answer there) every additive mask counts."""
    if not is_additive(mask) or mask.numel() == 0:
        return False
    if torch.compiler.is_compiling():
        return True
    top = mask.detach().amax(dim=-1)
    return bool(((top < SATURATED) & top.isfinite()).any())


def restrict(mask: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor:
    """`mask` (bool, float or None) further restricted to the boolean `allowed`."""
    if mask is None:
        return allowed
    if is_additive(mask):
        return mask.masked_fill(~allowed, float("-inf"))
    return mask & allowed


def normal_causality(is_causal: bool | str, n: int, m: int) -> bool | str:
    """False, True (top-left) or "bottom_right", the last only where it differs from both
    (n != m, n != 1): with one query (a decoding step) bottom-right masks nothing, with n == m
    it is top-left."""
    alignment = causal_alignment(is_causal)
    if alignment == "bottom_right" and n == 1:  # the one query is the last: it sees every key
        return False
    if alignment == "bottom_right" and n != m:
        return "bottom_right"
    return alignment is not None


def align_causal(
    attn_mask: torch.Tensor | None, is_causal: bool | str, n: int, m: int, device
) -> tuple[torch.Tensor | None, bool]:
    """(mask, is_causal) with top-left causality only: a bottom-right causal call with n != m
    becomes its explicit mask, 4-D, merged into `attn_mask` (j <= i + m - n); with one query
    (a decoding step) it masks nothing."""
    causality = normal_causality(is_causal, n, m)
    if causality == "bottom_right":
        causal = causal_mask(n, m, device, offset=m - n).view(1, 1, n, m)
        return restrict(attn_mask, causal), False
    return attn_mask, causality


def lower_bottom_right(kwargs: dict, features: Collection[str]) -> dict:
    """A family's checked kwargs (q (B, H, N, .), k (B, Hkv, M, .), attn_mask, is_causal) as a
    backend declaring `features` takes them: without ``bottom_right``, a bottom-right call
    arrives as its explicit mask with top-left causality (`align_causal`)."""
    if kwargs["is_causal"] != "bottom_right" or "bottom_right" in features:
        return kwargs
    n, m = kwargs["q"].shape[2], kwargs["k"].shape[2]
    mask, is_causal = align_causal(kwargs["attn_mask"], "bottom_right", n, m, kwargs["q"].device)
    return {**kwargs, "attn_mask": mask, "is_causal": is_causal}


def allowed_keys(
    attn_mask: torch.Tensor | None, is_causal: bool, n: int, m: int, device: torch.device
) -> torch.Tensor | None:
    """The full mask of a call (attn_mask and the causal mask merged; bool or float), or None."""
    if not is_causal:
        return attn_mask
    return restrict(attn_mask, causal_mask(n, m, device))


def as_boolean(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The keys a mask lets through: a float mask's finite entries, a boolean mask itself."""
    return mask > float("-inf") if is_additive(mask) else mask


def unmask_empty_rows(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Let rows that see no key attend everywhere, so a fused kernel stays finite.

    Returns the new mask and `has_key` (..., N, 1) bool; multiply the kernel's output by
    `has_key` to give those rows the contract's zeros (and zero gradients).
    """
    has_key = as_boolean(mask).any(dim=-1, keepdim=True)
    if is_additive(mask):
        return mask.masked_fill(~has_key, 0.0), has_key
    return mask | ~has_key, has_key
