"""Softmax attention on FlexAttention (torch.nn.attention.flex_attention), compiled.

The mask and causal flag become a ``mask_mod`` and a block mask, so fully masked key blocks are
skipped; a float mask's values are added by a ``score_mod``. Compiled once per input shape
(cached by torch). No dropout. A row with no allowed key gives zeros; a call with no keys
(M = 0) or no queries returns zeros without reaching the kernel.

CUDA only: FlexAttention's CPU path (torch 2.13) is wrong at some shapes and thread counts, so
the backend refuses CPU calls (see `CPU_REFUSAL`).
"""

import functools

import torch

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.softmax.family import FEATURES, LOW_AND_SINGLE
from attn_zoo.kernels.softmax.masks import allowed_keys, as_boolean, is_additive


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


@functools.lru_cache(maxsize=16)
def _causal_block_mask(n: int, m: int, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, qi, ki):
        return ki <= qi

    return create_block_mask(causal, None, None, n, m, device=device, _compile=False)


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
        FEATURES - {"dropout"},
        devices=frozenset({"cuda"}),
        dtypes=LOW_AND_SINGLE,
        why={"cpu": CPU_REFUSAL, "dropout": "FlexAttention has none"},
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
) -> torch.Tensor:  # (B, H, N, dv)
    from torch.nn.attention.flex_attention import create_block_mask

    (b, h, n, _), m = q.shape, k.shape[2]
    if n == 0 or m == 0:  # nothing to attend (zeros); with M = 0 the kernel divides by 0
        return q.new_zeros(b, h, n, v.shape[-1])
    block_mask = score_mod = None
    mask = allowed_keys(attn_mask, is_causal, n, m, q.device)
    if attn_mask is None and is_causal:
        block_mask = _causal_block_mask(n, m, q.device)
    elif mask is not None:
        allowed = as_boolean(mask).expand(b, h, n, m)

        def mask_mod(bi, hi, qi, ki):
            return allowed[bi, hi, qi, ki]

        block_mask = create_block_mask(mask_mod, b, h, n, m, device=q.device, _compile=False)
        if is_additive(mask):
            bias = mask.masked_fill(~allowed, 0.0).to(q.dtype).expand(b, h, n, m)

            def score_mod(score, bi, hi, qi, ki):
                return score + bias[bi, hi, qi, ki]

    return _compiled_flex()(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
        enable_gqa=k.shape[1] != h,
    )  # fmt: skip
