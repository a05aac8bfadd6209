"""Our softmax kernels as Hugging Face `transformers` attention implementations.

    from attn_zoo.interop.transformers import register
    register()  # once per process; then, unchanged:
    model = AutoModelForCausalLM.from_config(config, attn_implementation="attn_zoo_chunked")

`register()` adds one implementation per backend of the softmax kernel family, named
``attn_zoo_<backend>`` (``attn_zoo_naive``, ``attn_zoo_chunked``, ``attn_zoo_sdpa``,
``attn_zoo_flex``, ``attn_zoo_xformers``): its attention function to
`transformers.AttentionInterface` and its mask function to
`transformers.masking_utils.AttentionMaskInterface` (without a registered mask function
transformers builds no mask at all, so padding would be ignored). Models whose attention goes
through the attention interface (Llama, Mistral, Qwen2, ...; tested with transformers 5.23) then
run unchanged, `generate` and its KV caches (dynamic, static) included. A forced backend that
cannot serve a call raises `UnsupportedCallError` naming the backends that can (e.g.
``attn_zoo_xformers`` and ``attn_zoo_flex`` off CUDA). ``attn_zoo_flex`` compiles once per
(query, key) length pair, so cached generation compiles at every new token (and torch's
recompile limit then falls back to uncompiled FlexAttention).

How a call maps onto ours (`attention_forward`):
- grouped-query heads: key / value reach our kernels with their own Hkv heads (no repeat);
- the mask is the boolean one of our mask function (True = may attend) or a 4-D additive float
  mask a caller built (0 / a very negative value); both are our kernels' mask conventions. Its
  key length must be the keys' (M, or 1 to broadcast): a longer mask (one sized for a longer
  cache) is refused, as transformers' eager and sdpa refuse it (5.24; cutting it to its first
  M columns, as its flex_attention does, masks the wrong keys when the keys given are the
  last M positions);
- no mask on a causal call: top-left causality when the query and key lengths agree, else
  bottom-right (``j <= i + M - N``: cached decoding, the new queries are the last positions).
  Our mask function (`build_mask`, transformers' `sdpa_mask` otherwise) only omits the mask
  where that rule is right (equal lengths, or one query, with no padding); it builds the mask
  where transformers' SDPA path relies on top-left alignment with more keys than queries (the
  prefill of a static cache, whose unwritten slots are at the end);
- attention weights are not returned (as transformers' ``sdpa``): use ``eager`` for
  ``output_attentions``. Soft-capping, attention sinks, position biases and paged caches are
  refused (NotImplementedError) rather than silently ignored.

transformers is imported only inside the functions, so this module imports without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from attn_zoo.kernels.dispatch import family
from attn_zoo.kernels.softmax import softmax_attention

log = logging.getLogger("attn_zoo")

PREFIX = "attn_zoo_"
UNSUPPORTED_KWARGS = {
    "softcap": "logit soft-capping",
    "s_aux": "attention sinks",
    "sinks": "attention sinks",
    "position_bias": "an additive position bias",
    "cache": "a paged (continuous batching) cache",
}


def implementation_name(backend: str) -> str:
    """The transformers attention implementation name of softmax backend `backend`."""
    return PREFIX + backend


def causal_flag(n: int, m: int) -> bool | str:
    """Causality of a maskless causal call with n queries and m keys (see the module doc)."""
    return True if n == m else "bottom_right"


_warned: set[str] = set()


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, N, d)
    key: torch.Tensor,  # (B, Hkv, M, d)
    value: torch.Tensor,  # (B, Hkv, M, dv)
    attention_mask: torch.Tensor | None,  # bool (True = attend) or additive float, (B|1, 1|H, N, M)
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    *,
    backend: str = "auto",
    **kwargs,
) -> tuple[torch.Tensor, None]:  # ((B, N, H, dv), no weights)
    """transformers' attention-function signature on our softmax kernel `backend`."""
    for name, feature in UNSUPPORTED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"attn_zoo_{backend} does not support {feature} (`{name}`); use transformers' "
                f"eager, sdpa or flex_attention implementations for this model"
            )
    if kwargs.get("output_attentions") and "output_attentions" not in _warned:
        _warned.add("output_attentions")
        log.warning("attn_zoo_%s returns no attention weights: use eager for them", backend)
    n, m = query.shape[2], key.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    causal: bool | str = False
    if attention_mask is not None:
        if attention_mask.shape[-1] not in (1, m):
            raise ValueError(
                f"attention_mask {tuple(attention_mask.shape)}: its last dim must be the "
                f"{m} keys given (key {tuple(key.shape)}), or 1; a mask over more positions "
                "does not say which of them the keys are (transformers' eager and sdpa refuse "
                "it too)"
            )
        if attention_mask.is_floating_point() and attention_mask.dtype != query.dtype:
            attention_mask = attention_mask.to(query.dtype)
    elif is_causal:
        causal = causal_flag(n, m)
    out = softmax_attention(
        query, key, value, attn_mask=attention_mask, is_causal=causal, scale=scaling,
        dropout_p=dropout, backend=backend,
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def build_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    allow_is_causal_skip: bool = True,
    **kwargs,
) -> torch.Tensor | None:
    """transformers' boolean `sdpa_mask` (True = may attend), (B, 1, N, M), or None where the
    attention function's causality rule needs no mask: equal lengths or one query, no padding."""
    from transformers.masking_utils import sdpa_mask

    skip = allow_is_causal_skip and (q_length == kv_length or q_length == 1)
    return sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
        kv_offset=kv_offset, allow_is_causal_skip=skip, **kwargs,
    )  # fmt: skip


def _attention_function(backend: str):
    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                is_causal=None, **kwargs):  # fmt: skip
        return attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal,
            backend=backend, **kwargs,
        )  # fmt: skip

    forward.__name__ = forward.__qualname__ = f"{PREFIX}{backend}_attention_forward"
    forward.__doc__ = f"`attention_forward` on the softmax backend {backend!r}."
    return forward


_FUNCTIONS: dict[str, object] = {}  # one function per backend, so re-registering is a no-op


def register(backends: str | Iterable[str] | None = None) -> list[str]:
    """Register ``attn_zoo_<backend>`` with transformers for each of `backends` (a name or
    names; default: every backend of the softmax kernel family, available here or not; "auto"
    and the tier names are accepted too and pick a backend per call). Returns the registered
    names. Idempotent; an unknown backend raises ValueError naming the valid ones, before
    anything is registered."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    softmax = family("softmax")
    if backends is None:
        names = list(softmax.backends)
    else:
        names = [backends] if isinstance(backends, str) else list(backends)
    for name in names:
        softmax.check_name(name)
    registered = []
    for name in names:
        function = _FUNCTIONS.setdefault(name, _attention_function(name))
        AttentionInterface.register(implementation_name(name), function)
        AttentionMaskInterface.register(implementation_name(name), build_mask)
        registered.append(implementation_name(name))
    return registered


__all__ = ["attention_forward", "build_mask", "implementation_name", "register"]
