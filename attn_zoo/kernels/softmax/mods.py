"""Score and mask mods: attention variants as small functions of a score and its position, as
FlexAttention writes them (torch.nn.attention.flex_attention).

    score_mod(score, b, h, q_idx, kv_idx) -> the score to use           (ALiBi, softcapping)
    mask_mod(b, h, q_idx, kv_idx) -> True where query q_idx may see key kv_idx   (windows)

Here they are called once per tile with broadcasting index tensors (b (B,1,1,1), h (1,H,1,1),
q_idx (1,1,N,1), kv_idx (1,1,1,M); a tile's ranges in the chunked kernel), so they must be
written with tensor operations (``torch.where``, comparisons, arithmetic), not Python `if`s on
values. Positions count from 0 in q and in k. The softmax family takes them on every backend:
naive and chunked apply them (chunked per tile: O(N block) memory; a mask_mod with a
`kv_range(q_start, q_stop, m)` hint, as `sliding_window`'s, lets it skip the key tiles outside
the range: O(N w) time), the others get a mask_mod as a materialised boolean mask (O(N M)
memory) and refuse a score_mod by capability. Gradients flow through a score_mod to q and k;
tensors a mod captures get none.

Named mods (`MODS`, for grid files and mechanism kwargs: ``mask_mod = { name =
"sliding_window", window = 64 }``): causal, sliding_window, prefix_lm, document, alibi, softcap.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch

from attn_zoo.registry import Registry

ScoreMod = Callable[..., torch.Tensor]
MaskMod = Callable[..., torch.Tensor]
MODS: Registry[Callable[..., Callable]] = Registry("attention mod")


def mod_indices(
    b: int, h: int, q: tuple[int, int], k: tuple[int, int], device
) -> tuple[torch.Tensor, ...]:
    """Index tensors (b, h, q_idx, kv_idx) broadcasting to (b, h, q1 - q0, k1 - k0), for the
    queries q = (q0, q1) and keys k = (k0, k1)."""
    return (
        torch.arange(b, device=device).view(b, 1, 1, 1),
        torch.arange(h, device=device).view(1, h, 1, 1),
        torch.arange(*q, device=device).view(1, 1, -1, 1),
        torch.arange(*k, device=device).view(1, 1, 1, -1),
    )


def mask_from_mod(mask_mod: MaskMod, b: int, h: int, n: int, m: int, device) -> torch.Tensor:
    """`mask_mod` materialised: boolean (B or 1, H or 1, N, M)."""
    allowed = mask_mod(*mod_indices(b, h, (0, n), (0, m), device))
    return torch.as_tensor(allowed, device=device).to(torch.bool).expand(b, h, n, m)


def apply_score_mod(score_mod: ScoreMod | None, scores: torch.Tensor, indices) -> torch.Tensor:
    return scores if score_mod is None else score_mod(scores, *indices).to(scores.dtype)


def check_mod(name: str, mod: object) -> None:
    if mod is not None and not callable(mod):
        raise ValueError(
            f"{name} must be a function ({name}(...) -> tensor) or None, got {type(mod).__name__}"
        )


def build_mod(spec: object) -> Callable | None:
    """A mod from a name (``"causal"``), a table naming one with its arguments (``{"name":
    "sliding_window", "window": 64}``), or a function (as is); None stays None."""
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        return MODS.build(spec)
    if isinstance(spec, dict) and isinstance(spec.get("name"), str):
        kwargs = {k: v for k, v in spec.items() if k != "name"}
        return MODS.build(spec["name"], **kwargs)
    raise ValueError(
        f"a mod is a name ({', '.join(MODS.names())}), a table {{ name = ..., ... }} or a "
        f"function; got {spec!r}"
    )


def shift_queries(mod: Callable | None, offset: int, score: bool) -> Callable | None:
    """`mod` seeing query i as position i + `offset`: the new queries of a cached decoding
    step are the last positions of the keys (offset = M - N)."""
    if mod is None or offset == 0:
        return mod
    if score:

        def shifted_score(score, b, h, q_idx, kv_idx):
            return mod(score, b, h, q_idx + offset, kv_idx)

        return shifted_score

    def shifted_mask(b, h, q_idx, kv_idx):
        return mod(b, h, q_idx + offset, kv_idx)

    if hasattr(mod, "kv_range"):
        shifted_mask.kv_range = lambda i0, i1, m: mod.kv_range(i0 + offset, i1 + offset, m)
    return shifted_mask


# Positions are int64 tensors: an int setting compared with them must fit one
_INT64_MAX = torch.iinfo(torch.int64).max


def _positive(name: str, value: object, kind: type = int) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    if not ok or (kind is int and not isinstance(value, int)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: must be a positive {kind.__name__}")
    if kind is int and value > _INT64_MAX:
        raise ValueError(
            f"{name}={value!r}: must be a positive int <= 2**63 - 1 (positions are int64)"
        )


@MODS.register("causal")
def causal() -> MaskMod:
    """Key j visible to query i iff j <= i (top-left causality as a mask_mod)."""

    def causal_mask(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    return causal_mask


@MODS.register("sliding_window")
def sliding_window(window: int, causal: bool = True) -> MaskMod:
    """Query i sees the `window` keys i - window + 1 .. i (causal) or |i - j| < window."""
    _positive("window", window)
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r}: must be true or false (a bool)")

    def sliding_window_mask(b, h, q_idx, kv_idx):
        near = (q_idx - kv_idx).abs() < window
        return near & (kv_idx <= q_idx) if causal else near

    def kv_range(q_start: int, q_stop: int, m: int) -> tuple[int, int]:
        stop = q_stop if causal else q_stop + window - 1
        return max(0, q_start - window + 1), min(m, stop)

    sliding_window_mask.kv_range = kv_range
    return sliding_window_mask


@MODS.register("prefix_lm")
def prefix_lm(prefix: int) -> MaskMod:
    """The first `prefix` keys visible to every query, causal after them (a prefix LM)."""
    _positive("prefix", prefix)

    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (kv_idx <= q_idx)

    return prefix_lm_mask


@MODS.register("document")
def document(lengths: list[int]) -> MaskMod:
    """Packed documents of `lengths` tokens, in order (positions past their sum: one more
    document): a query sees only keys of its own document. Combine with causality for a
    packed causal LM."""
    if not isinstance(lengths, list | tuple) or not lengths:
        raise ValueError(f"lengths={lengths!r}: must be a non-empty list of positive ints")
    for i, length in enumerate(lengths):
        _positive(f"lengths[{i}]", length)
    ends = list(itertools.accumulate(lengths))
    if ends[-1] > _INT64_MAX:
        raise ValueError(f"lengths={lengths!r}: their sum must be at most 2**63 - 1 (int64)")

    def document_id(position: torch.Tensor) -> torch.Tensor:  # how many documents end <= it
        return sum((position >= end).long() for end in ends)  # no captured tensor: flex-safe

    def document_mask(b, h, q_idx, kv_idx):
        return document_id(q_idx) == document_id(kv_idx)

    return document_mask


@MODS.register("alibi")
def alibi(n_heads: int) -> ScoreMod:
    """ALiBi (Press et al. 2022): score - slope_h (i - j), slopes 2^(-8 h' / H), h' = 1..H."""
    _positive("n_heads", n_heads)

    def alibi_bias(score, b, h, q_idx, kv_idx):  # the slope computed, not looked up: flex-safe
        slope = torch.exp2(-8.0 * (h + 1) / n_heads)
        return score - slope * (q_idx - kv_idx)

    return alibi_bias


@MODS.register("softcap")
def softcap(cap: float) -> ScoreMod:
    """Logit softcapping (Gemma 2): cap * tanh(score / cap)."""
    _positive("cap", cap, float)

    def softcap_score(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return softcap_score
