"""Softmax attention on FlexAttention (torch.nn.attention.flex_attention), compiled.

Score and mask mods (mods.py) run natively, their results' types checked (their shapes are
FlexAttention's scalars); it calls them again in backward, so it refuses an impure mod and one
capturing a tensor that requires grad (``impure_mod``, ``mod_grad``: naive serves them). The
mask, the causal flag and a mask mod become one ``mask_mod`` and a block mask, so fully masked
key blocks are skipped; a float mask's values are added after the score mod, as on the naive
path. Compiled once per input shape (cached by torch). No dropout. A row with no allowed key
gives zeros; a call with no keys (M = 0) or no queries returns zeros without reaching the
kernel.

CUDA only: FlexAttention's CPU path (torch 2.13) is wrong at some shapes and thread counts, so
the backend refuses CPU calls (see `CPU_REFUSAL`).
"""

import functools

import torch

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.softmax.family import (
    FEATURES,
    LOW_AND_SINGLE,
    MODS,
    RECOMPUTES_MODS,
    SATURATED_WHY,
)
from attn_zoo.kernels.softmax.masks import as_boolean, is_additive
from attn_zoo.kernels.softmax.mods import MaskMod, ScoreMod, and_masks, checked_result


def flex_missing() -> str | None:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError as err:
        return f"FlexAttention needs torch >= 2.5 ({err})"
    return None


CPU_REFUSAL = (
    "FlexAttention's CPU path gives wrong results at some shapes and thread counts in torch "
    f"{torch.__version__} (e.g. float32 q, k, v of shape (1, 2, 40, 8), no mask: output off "
    "the float64 reference by up to 0.7, or NaN; M = 0 keys kills the process with SIGFPE)"
)


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


@functools.lru_cache(maxsize=16)
def _causal_block_mask(n: int, m: int, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_causal, None, None, n, m, device=device, _compile=False)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@register_backend(
    "softmax",
    "flex",
    tier="fused",
    priority=20,
    available=flex_missing,
    capabilities=Capabilities(
        (FEATURES - {"dropout", "narrow_heads", "saturated_mask"} - RECOMPUTES_MODS) | MODS,
        devices=frozenset({"cuda"}),
        dtypes=LOW_AND_SINGLE,
        why={
            "cpu": CPU_REFUSAL,
            "dropout": "FlexAttention has none",
            "narrow_heads": "FlexAttention's kernels need key and value head widths >= 16",
            "saturated_mask": SATURATED_WHY,
            "impure_mod": "its backward calls the mods again; a mod declaring pure = False "
            "would give other scores there",
            "mod_grad": "not checked here that its backward gives the tensors a score mod "
            "captures their gradients",
        },
    ),
)
def flex(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    score_mod: ScoreMod | None = None,
    mask_mod: MaskMod | None = None,
) -> torch.Tensor:  # (B, H, N, dv)
    from torch.nn.attention.flex_attention import create_block_mask

    (b, h, n, _), m = q.shape, k.shape[2]
    if n == 0 or m == 0:  # nothing to attend (zeros); with M = 0 the kernel divides by 0
        return q.new_zeros(b, h, n, v.shape[-1])
    mask_mods, bias = [], None
    if mask_mod is not None:  # and_masks checks its result's type (flex: scalar calls)
        mask_mods.append(mask_mod)
    if is_causal:
        mask_mods.append(_causal)
    if attn_mask is not None:
        allowed = as_boolean(attn_mask).expand(b, h, n, m)
        mask_mods.append(lambda bi, hi, qi, ki: allowed[bi, hi, qi, ki])
        if is_additive(attn_mask):
            bias = attn_mask.masked_fill(~allowed, 0.0).to(q.dtype).expand(b, h, n, m)
    if mask_mods == [_causal]:
        block_mask = _causal_block_mask(n, m, q.device)
    elif mask_mods:
        block_mask = create_block_mask(and_masks(*mask_mods), b, h, n, m, device=q.device,
                                       _compile=False)  # fmt: skip
    else:
        block_mask = None

    def scores(score, bi, hi, qi, ki):  # the naive path's order: score_mod, then the bias
        if score_mod is not None:
            result = score_mod(score, bi, hi, qi, ki)
            score = checked_result("score_mod", score_mod, result, dtype=score.dtype)
        return score if bias is None else score + bias[bi, hi, qi, ki]

    modded = score_mod is not None or bias is not None
    return _compiled_flex()(
        q, k, v, score_mod=scores if modded else None, block_mask=block_mask, scale=scale,
        enable_gqa=k.shape[1] != h,
    )  # fmt: skip
