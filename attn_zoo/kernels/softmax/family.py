"""The softmax kernel family: its inputs, the call they make, the features backends declare.

    q (B, H, N, dk), k (B, Hkv, M, dk), v (B, Hkv, M, dv), H a multiple of Hkv (grouped-query
    heads); attn_mask boolean (True = may attend) or additive float (-inf = masked),
    broadcastable to (B, H, N, M); is_causal False, True / "top_left" (j <= i, as torch SDPA) or
    "bottom_right" (j <= i + M - N, as KV-cache decoding); scale defaulting to 1/sqrt(dk);
    dropout on the attention weights.

Features a call may need (`describe_call`): ``grad``, ``mask``, ``float_mask`` (an additive
mask), ``causal``, ``dropout``, ``dv_ne_dk`` (value width != key width), ``gqa`` (fewer kv
heads than query heads), ``narrow_heads`` (a key or value head width below 16), ``score_mod``
(a score mod, mods.py), ``impure_mod`` (a mod declaring pure = False, in a call with a
backward: served only by backends calling it once per tile, in the forward), ``mod_grad`` (a
score mod capturing a tensor that requires grad: served only where that tensor gets its
gradient; see `mod_features`) and ``saturated_mask`` (a backward through an additive mask with
a row whose every key is masked by a finite value below -100, float32's min say:
masks.saturated; in FEATURES, so a backend of your own claims it and the testing kit checks it,
with its "float32_min" masks; our fused backends keeping lse = m + log l decline it,
`SATURATED_WHY`). A mask mod is a ``mask`` call: backends declaring ``mask_mod`` (naive,
chunked, sdpa) take it as is, the others as its materialised boolean mask (`lower_call`). A
bottom-right causal call with N != M is described as a ``mask`` call; backends declaring
``bottom_right`` (chunked) take it as is_causal="bottom_right", the others as an explicit mask
(masks.lower_bottom_right).
"""

import torch

from attn_zoo.kernels.dispatch import Call, constant_when_compiled, define_family
from attn_zoo.kernels.softmax.masks import (
    is_additive,
    lower_bottom_right,
    normal_causality,
    restrict,
    saturated,
)
from attn_zoo.kernels.softmax.mods import (
    MaskMod,
    ScoreMod,
    captured_tensors,
    check_mod,
    check_pointwise,
    is_pure,
    mask_from_mod,
    reads_learnable,
)

FEATURES = frozenset(
    {"grad", "mask", "float_mask", "causal", "dropout", "dv_ne_dk", "gqa", "narrow_heads",
     "impure_mod", "mod_grad", "saturated_mask"}
)  # fmt: skip
RECOMPUTES_MODS = frozenset({"impure_mod", "mod_grad"})  # refused by backends calling a mod again
NARROW = 16  # a head width below this is "narrow_heads" (FlexAttention's kernels need >= 16)
LOW_AND_SINGLE = frozenset({torch.float16, torch.bfloat16, torch.float32})
BOTTOM_RIGHT = frozenset({"bottom_right"})  # declared by backends taking it without a mask
MODS = frozenset({"score_mod", "mask_mod"})  # declared by backends applying mods themselves
# why a kernel keeping only lse = m + log l per row for its backward declines saturated_mask
SATURATED_WHY = (
    "its backward reads lse = m + log l, which loses log l beside a row max m of a finite mask "
    "value far below the scores (float32's min: twice the gradient); naive and chunked serve it"
)


def check_mask(attn_mask, q, k) -> torch.Tensor | None:
    """Validate a mask against q (B, H, N, .) and k (B, ., M, .); its 4-D view or None."""
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise ValueError(
            f"attn_mask must be boolean (True = may attend) or float (added to the scores, "
            f"-inf = masked), got {attn_mask.dtype}"
        )
    target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    if len(shape) > 4 or any(s not in (1, t) for s, t in zip(shape, target, strict=True)):
        raise ValueError(
            f"attn_mask shape {tuple(attn_mask.shape)} does not broadcast to "
            f"(B, H, N, M) = {target}"
        )
    return attn_mask.reshape(shape).to(q.device)


def check_qkv(q, k, v, attn_mask, dropout_p) -> torch.Tensor | None:
    """Validate shapes and options; returns the mask viewed as 4-D (or None)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (B, heads, length, width), got shape {tuple(t.shape)}"
            )
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; q is {q.dtype} on {q.device}")
    if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0]:
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must share batch, heads and length with "
            f"each other and batch with q {tuple(q.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q width {q.shape[-1]} != k width {k.shape[-1]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads {q.shape[1]} must be a multiple of kv heads {k.shape[1]}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p}: must be in [0, 1)")
    return check_mask(attn_mask, q, k)


def check_inputs(
    q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, score_mod=None,
    mask_mod=None,
) -> dict:  # fmt: skip
    """The call's keyword arguments, validated, with the mask viewed as 4-D and is_causal
    False, True (top-left) or "bottom_right" (N != M, N > 1; masks.normal_causality)."""
    mask = check_qkv(q, k, v, attn_mask, dropout_p)
    is_causal = normal_causality(is_causal, q.shape[2], k.shape[2])
    check_mod("score_mod", score_mod)
    check_mod("mask_mod", mask_mod)
    check_mods(q, k, score_mod, mask_mod)
    return dict(
        q=q, k=k, v=v, attn_mask=mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p,
        score_mod=score_mod, mask_mod=mask_mod,
    )  # fmt: skip


def check_mods(q: torch.Tensor, k: torch.Tensor, score_mod=None, mask_mod=None) -> None:
    """Both mods checked pointwise (mods.check_pointwise) for a call of queries q (B, H, N, d)
    and keys k (B, Hkv, M, d): every backend's check, flex's too, and that of the mechanisms'
    materialised maps (naive.attention_weights, which does not check)."""
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    half = q.dtype in (torch.float16, torch.bfloat16)  # scores in float32 then (naive, chunked)
    check_pointwise("score_mod", score_mod, shape, torch.float32 if half else q.dtype, q.device)
    check_pointwise("mask_mod", mask_mod, shape, None, q.device)


def describe_call(
    q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, score_mod=None,
    mask_mod=None,
) -> Call:  # fmt: skip
    """The `Call` a softmax attention call makes (for backend choice)."""
    tensors = (q, k, v) if attn_mask is None else (q, k, v, attn_mask)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    needs = {
        "grad": grad,
        "mask": attn_mask is not None or is_causal == "bottom_right" or mask_mod is not None,
        "score_mod": score_mod is not None,
        "float_mask": is_additive(attn_mask),
        "saturated_mask": grad and saturated(attn_mask),
        "causal": is_causal is True,
        "dropout": dropout_p > 0,
        "dv_ne_dk": v.shape[-1] != k.shape[-1],
        "gqa": k.shape[1] != q.shape[1],
        "narrow_heads": min(q.shape[-1], v.shape[-1]) < NARROW,
    }
    features = frozenset(f for f, used in needs.items() if used)
    features |= mod_features(score_mod, mask_mod, grad)
    if (  # what the walk cannot follow, seen by calling the mod (eager only: under compile,
        "mod_grad" not in features  # the walk's constant answer stands)
        and score_mod is not None
        and torch.is_grad_enabled()
        and is_pure(score_mod)
        and not torch.compiler.is_compiling()
        and reads_learnable(score_mod, q.shape[0], q.shape[1], q.dtype, q.device)
    ):
        features |= {"mod_grad", "grad"}
    return Call(q.device.type, q.dtype, features)


# Under torch.compile the closure walk would break the trace: taken as a constant there (grad
# mode is guarded; a captured tensor's requires_grad changed later is not seen)
@constant_when_compiled
def mod_features(
    score_mod: ScoreMod | None, mask_mod: MaskMod | None, grad: bool
) -> frozenset[str]:
    """The features the mods add to a call (`grad`: q, k, v or the mask need a gradient):
    ``mod_grad`` and ``grad`` (under grad mode, the score mod captures a tensor requiring
    grad, `captured_tensors`; in eager mode `describe_call` also calls a pure one,
    `reads_learnable`), ``impure_mod`` (one declares pure = False, and there is a backward to
    call it again: without one, every backend calls it once per tile)."""
    features = set()
    if torch.is_grad_enabled() and any(t.requires_grad for t in captured_tensors(score_mod)):
        features |= {"mod_grad", "grad"}
    if (grad or features) and not (is_pure(score_mod) and is_pure(mask_mod)):
        features.add("impure_mod")
    return frozenset(features)


def lower_call(kwargs: dict, features: frozenset[str]) -> dict:
    """Checked `kwargs` as a backend declaring `features` takes them: bottom-right causality
    as a mask where it lacks ``bottom_right`` (masks.lower_bottom_right); a mask mod
    materialised into the mask where it lacks ``mask_mod``; mods it does not declare left out
    (a score mod never reaches such a backend: the call's ``score_mod`` feature refuses it)."""
    kwargs = lower_bottom_right(kwargs, features)
    mask_mod = kwargs["mask_mod"]
    if mask_mod is not None and "mask_mod" not in features:
        q, k = kwargs["q"], kwargs["k"]
        allowed = mask_from_mod(mask_mod, q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device)
        kwargs = {**kwargs, "attn_mask": restrict(kwargs["attn_mask"], allowed)}
    return {k: v for k, v in kwargs.items() if k not in MODS or k in features}


SOFTMAX = define_family("softmax", check_inputs, describe_call, lower_call)
