"""Attention surgery: any registered mechanism in place of a Hugging Face causal LM's attention.

    from attn_zoo.interop.surgery import swap_attention, load_swapped
    model = AutoModelForCausalLM.from_pretrained(folder)        # Llama, Mistral or Qwen2
    swap_attention(model, "gla", layers=[2, 3], gate_rank=8)     # mechanism, kwargs by name
    model.generate(ids, max_new_tokens=20)                       # cached where it can be
    model.save_pretrained(out);  again = load_swapped(out)       # the swap is in config.json

Supported: models whose decoder layers hold a ``self_attn`` with q_proj, k_proj, v_proj,
o_proj and whose attention goes through transformers' attention interface, by model_type:
`SUPPORTED` (llama, mistral, qwen2; tested with transformers 5.24). Others are refused by
name, and so are attention implementations whose masks this module does not read
(flash_attention_*, flex_attention: use eager, sdpa or attn_zoo_*) and heads of a width
``config.head_dim`` other than hidden_size // num_attention_heads (Mistral-Nemo): every zoo
mechanism's heads are d_model // n_heads wide, so neither the model's projections nor its
rotary tables would fit.

Design: each chosen layer's ``self_attn`` becomes a `SwappedAttention`, a wrapper that takes
transformers' call (hidden_states (B, N, D), position_embeddings (cos, sin) (B, N, head_dim),
attention_mask, cache, ...) and calls the zoo mechanism ``mechanism(x, attn_mask, is_causal,
rope, cache)``, returning (output, None) as the layer expects. The mechanism is built by name
(`attn_zoo.build`) with d_model, n_heads, n_kv_heads, dropout and layer (1-based depth)
filled in from the model's config where it accepts them (heads divided by its
`model_heads_per_head`: `mechanism_settings`); the caller's kwargs win.

- Weights: a mechanism projection named wq / wq_attn, wk / wk_attn, wv, wo (an nn.Linear of
  the mechanism itself) starts as q_proj, k_proj, v_proj, o_proj where the weight shapes agree
  (so grouped-query heads copy as they are). Biases follow the model's: a copied projection
  gains the model's bias where it had none (Qwen2's q, k, v) and has its own bias zeroed where
  the model has none, so it starts as the same affine map. A model projection that starts
  none (no projection of those names, or another shape: gla's half-width queries, additive's
  ungrouped keys and values) is named in a logged warning, and the mechanism's own starts as
  it defines it, as does everything else (feature maps, gates, relation projections, lambda,
  a bias of a projection not copied). Dual attention with ``combine="sum"`` (its
  self-attention branch as wide as the model, its relational heads' output added) starts its
  self-attention branch so, and its relational branch's output projection at zero: relational
  heads added to the model's own, the layer the model's at the start (`start_from_model`).
- RoPE: the model's own tables (its rotary embedding's cos, sin at the model's position ids,
  rope scaling included) are applied to the mechanism's queries and keys as the model applies
  them (`ModelRotary`: rotate_half, in the activations' dtype), so `standard` in place of the
  original gives its logits. A mechanism takes them when its forward has a ``rope`` argument
  and a probe call with the model's head width succeeds; ``rope="auto"`` runs the others
  without rotary positions (logged: gla, linear and additive refuse RoPE; differential given
  the model's head count rotates half-width maps), ``rope=True`` refuses them, ``rope=False``
  never applies it. A mechanism reading absolute positions itself (its
  ``absolute_positions()``: a mod not declaring `relative`, attn_zoo/kernels/softmax/mods.py;
  positional symbols) counts them 0..N-1 after the cached ones: a call whose positions are
  others (position_ids, left padding) is refused (`SwappedAttention.check_positions`).
- Attention weights: transformers collects them from its own attention modules only, so a
  swapped layer refuses ``output_attentions`` (by argument or config) rather than leave the
  tuple misaligned; attn_zoo/maps.py records the swapped layers' maps.
- Masks: the model's 4-D mask (boolean, or eager's additive 0 / min) must be causal and key
  padding only: it is passed as is_causal (bottom-right with cached positions) and a key
  padding mask (B, 1, 1, M), None without padding. Anything else (a sliding window that
  reaches back less than the sequence, packed sequences) is refused by `split_mask`. A
  mechanism that takes no padding mask at all (gla) raises its own error.
- Cached generation: the mechanism's state (its `LayerCache`: keys and values, or the
  recurrent state) is kept per layer on the model's cache object (DynamicCache, generate's
  default; static and quantized caches are refused). The cache layer itself holds an int64
  marker (B, 1, M, 1) (the batch row of each position), so the model reads its length as
  usual and a beam search's reordering (or a batch selection) reaches the mechanism's state,
  re-indexed by the marker's rows. A mechanism without a cache (``supports_cache`` False, or
  no ``cache`` argument: sigmoid with bias=None, axial, prefix_lm mask mods, dual attention
  with such a branch) may change
  earlier positions' outputs as the sequence grows, so no layer can be decoded alone:
  `swap_attention` sets ``generation_config.use_cache = False`` and generate recomputes the
  whole context at every step (the uncached path); a cache passed anyway is refused at its
  second call. A mechanism whose cached call takes no padding mask (linear, additive: probed
  at the swap) runs a padded prompt uncached, and a later call on that cache is refused
  likewise: generate a padded batch with use_cache=False. A cache filled before the swap is
  refused the same way.
- Saving: `swap_attention` records each swap (mechanism, layers, kwargs, backend, rope) in
  ``config.attn_zoo_surgery``, so ``save_pretrained`` writes it to config.json;
  `load_swapped` builds the model from the config, replays the swaps and loads the weights
  from the local folder as transformers reads them (model.safetensors, or the shards its
  index names; other *.safetensors files are not read). Kwargs must therefore be JSON values.

transformers and safetensors are imported only inside the functions.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attn_zoo.kernels.rotary import Rotary
from attn_zoo.kernels.softmax.masks import causal_mask
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.mechanisms.dual import DualAttention
from attn_zoo.mechanisms.registry import MECHANISMS, build, mechanism_class

log = logging.getLogger("attn_zoo")

SUPPORTED = ("llama", "mistral", "qwen2")  # config.model_type
IMPLEMENTATIONS = ("eager", "sdpa")  # and every attn_zoo_<backend>: masks this module reads
RECORD = "attn_zoo_surgery"  # the config attribute listing the swaps
STATE = "attn_zoo_state"  # the attribute of a transformers cache layer holding our LayerCache
# mechanism projection names that start from each of the model's projections, first found
PROJECTIONS = {
    "q_proj": ("wq", "wq_attn"),
    "k_proj": ("wk", "wk_attn"),
    "v_proj": ("wv",),
    "o_proj": ("wo",),
}


@dataclass(frozen=True)
class ModelRotary(Rotary):
    """The model's rotary tables for one call, applied as Hugging Face's Llama applies them:
    cos, sin (B, N, head_dim) (each half of the width repeats the frequencies), x (B, H, N,
    head_dim) -> x cos + rotate_half(x) sin, rotate_half(x) = (-x[d/2:], x[:d/2]), in x's dtype
    (our `Rotary` rounds q and k to float32: a tiny float64 Llama's logits then differ from
    the original's by 1.6e-6, against 0 with this one)."""

    interleaved: bool = False

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != self.cos.shape[-2:]:
            raise ValueError(
                f"the model's RoPE tables {tuple(self.cos.shape)} do not fit queries or keys "
                f"{tuple(x.shape)}: (B, H, N, d) needs d = the model's head_dim "
                f"{self.cos.shape[-1]}"
            )
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        cos, sin = self.cos[:, None].type_as(x), self.sin[:, None].type_as(x)
        return x * cos + rotated * sin


def split_mask(attention_mask: torch.Tensor | None, n: int, past: int) -> torch.Tensor | None:
    """The key padding mask (B, H?, 1, M) (True = a real token; M = past + n) of the model's
    4-D mask (B, H?, n, M), boolean (True = may attend) or additive (0 = may attend), or None
    when nothing is padded. ValueError unless the mask is exactly causal (bottom-right: the n
    queries are the last positions) and key padding, at the rows of real tokens (a padding
    token's row may be anything); a mask over fewer than M keys (a sliding window cache's)
    is refused as the window it is."""
    if attention_mask is None:
        return None
    m = past + n
    shape = tuple(attention_mask.shape)
    if attention_mask.dim() == 4 and shape[-2] == n and shape[-1] < m:  # a window cache's
        raise ValueError(
            f"attention_mask {shape} covers the last {shape[-1]} of {m} positions ({n} new, "
            f"{past} cached): the model's cache keeps a sliding window shorter than the "
            "sequence, a mask swapped attention does not follow (it serves causal attention "
            "over padded batches only)"
        )
    if attention_mask.dim() != 4 or shape[-2:] != (n, m):
        raise ValueError(
            f"attention_mask {shape}: swapped attention takes the model's "
            f"4-D mask (B, 1, {n}, {m}) for {n} new and {past} cached positions (use the "
            "model's eager or sdpa attention implementation and a DynamicCache)"
        )
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    keys = allowed[..., -1:, :]  # the last query sees every key causally: its row is the padding
    expected = keys & causal_mask(n, m, allowed.device, offset=past)
    real = keys[..., 0, past:, None]  # (B, H?, n, 1): the queries that are real tokens
    if not ((allowed == expected) | ~real).all():
        raise ValueError(
            "attention_mask is not causal with key padding (a sliding window shorter than the "
            "sequence, packed sequences, a custom mask): swapped attention serves causal "
            "attention over padded batches only"
        )
    return None if keys.all() else keys


def select_rows(cache: LayerCache, rows: torch.Tensor) -> None:
    """Re-index every tensor of `cache` (and of its children) by batch `rows`, in place: the
    batch is the first dimension of each cached tensor and of each state tensor (or tuple of
    tensors)."""

    def select(value):
        return tuple(v[rows] for v in value) if isinstance(value, tuple | list) else value[rows]

    cache.tensors = {name: t[rows] for name, t in cache.tensors.items()}
    cache.state = {name: select(value) for name, value in cache.state.items()}
    for child in cache.children.values():
        select_rows(child, rows)


def layer_state(cache, layer_idx: int, x: torch.Tensor) -> tuple[LayerCache, int]:
    """Our `LayerCache` of layer `layer_idx`, kept on the transformers cache `cache`, and the
    positions the cache had seen before x (B, n, D); x's positions are then counted on the
    cache's own layer (an int64 marker (B, 1, n, 1) holding each position's batch row) so that
    the model reads its length. A cache reordered since the last call (beam search, batch
    selection) has the marker's rows reordered: the state is re-indexed by them. A cache layer
    filled by another attention (the model's own, before the swap) holds no state of ours: an
    empty one is returned and the cache left as it is (the caller refuses it: its length is
    not the positions seen, `SwappedAttention.lost_state`)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    if not isinstance(cache, DynamicCache):
        raise ValueError(
            f"swapped attention keeps its state in a DynamicCache (generate's default), got "
            f"{type(cache).__name__}: pass no cache_implementation"
        )
    batch, n = x.shape[:2]
    state, seen = LayerCache(), 0
    if layer_idx < len(cache.layers) and cache.layers[layer_idx].get_seq_length() > 0:
        layer = cache.layers[layer_idx]
        seen = layer.get_seq_length()
        if not hasattr(layer, STATE):
            return state, seen
        state = getattr(layer, STATE)
        rows = layer.keys[:, 0, -1, 0]
        if not torch.equal(rows, torch.arange(len(rows), device=rows.device)):
            select_rows(state, rows)
    marker = torch.arange(batch, device=x.device).view(batch, 1, 1, 1).expand(batch, 1, n, 1)
    cache.update(marker, marker, layer_idx)
    layer = cache.layers[layer_idx]
    if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
        raise ValueError(
            f"layer {layer_idx}'s cache is a {type(layer).__name__}: swapped attention needs "
            "DynamicLayer or DynamicSlidingWindowLayer (a plain DynamicCache)"
        )
    setattr(layer, STATE, state)
    return state, seen


def keeps_cache(mechanism: nn.Module) -> bool:
    """Whether `mechanism` decodes from its own cache: its forward takes one and it says it
    can (``supports_cache``)."""
    takes = "cache" in inspect.signature(mechanism.forward).parameters
    return takes and bool(getattr(mechanism, "supports_cache", False))


class SwappedAttention(nn.Module):
    """A zoo mechanism in place of a decoder layer's self_attn: transformers' call in, the
    mechanism's causal call inside (module docstring). `rope`: apply the model's rotary
    tables to the mechanism's queries and keys; `padded_cache`: its cached calls take a key
    padding mask (else a padded prompt runs uncached and the cache is not continued);
    `config`: the model's (its ``output_attentions``)."""

    def __init__(
        self, mechanism: nn.Module, layer_idx: int, rope: bool, padded_cache: bool, config
    ):
        super().__init__()
        self.mechanism, self.layer_idx = mechanism, layer_idx
        self.rope, self.padded_cache, self.config = rope, padded_cache, config

    def forward(
        self,
        hidden_states: torch.Tensor,  # (B, n, D)
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin (B, n, head_dim)
        attention_mask: torch.Tensor | None = None,  # (B, 1, n, M) bool or additive, or None
        cache=None,  # a transformers DynamicCache, or None (no cached decoding)
        position_ids: torch.Tensor | None = None,  # (B, n) or (1, n)
        **kwargs,  # use_cache, output_attentions, ...: read through the cache and the config
    ) -> tuple[torch.Tensor, None]:  # (B, n, D), no attention weights
        if kwargs.get("output_attentions", getattr(self.config, "output_attentions", False)):
            raise ValueError(self.no_weights())
        x = hidden_states
        state, seen = (None, 0) if cache is None else layer_state(cache, self.layer_idx, x)
        if state is not None and state.length != seen:
            raise ValueError(self.lost_state(seen, state.length))
        keys = split_mask(attention_mask, x.shape[1], seen)
        self.check_positions(position_ids, keys, seen, x.shape[1])
        cached = keeps_cache(self.mechanism) and (keys is None or self.padded_cache)
        if seen == 0 and not cached:
            state = None  # run uncached: the cache counts the positions, a next call is refused
        call = {"attn_mask": keys, "is_causal": True if seen == 0 else "bottom_right"}
        if self.rope:
            call["rope"] = ModelRotary(*position_embeddings)
        if state is not None:
            call["cache"] = state
        return self.mechanism(x, **call), None

    def lost_state(self, seen: int, kept: int) -> str:
        """Why the model's cache (`seen` positions) and the mechanism's state (`kept`) differ."""
        name = type(self.mechanism).__name__
        if not keeps_cache(self.mechanism):
            why = (
                "it keeps no cache (supports_cache is False: swap_attention made "
                "use_cache=False generate's default), or "
            )
        elif not self.padded_cache:
            why = "its cache takes no padding mask and the prompt was padded, or "
        else:
            why = ""
        return (
            f"layer {self.layer_idx}: the model's cache holds {seen} positions, {name}'s state "
            f"{kept}: {why}the cache was filled before the swap (by the model's own attention) "
            "or cropped (assisted decoding). Generate with use_cache=False, or start a new cache"
        )

    def no_weights(self) -> str:
        """Why output_attentions is refused, and what gives the swapped layers' weights."""
        return (
            f"layer {self.layer_idx}: output_attentions=True, but the layer's attention is "
            f"swapped ({type(self.mechanism).__name__}): transformers collects the weights of "
            "its own attention modules only, so the tuple would leave this layer out and its "
            "indices would no longer be the layers'. Pass output_attentions=False (and "
            "config.output_attentions=False); for the swapped layers' maps use "
            "attn_zoo.maps.record_attention_maps(model, ids, use_cache=False) (mechanisms "
            "with attention_maps: standard, relational, dual, differential)"
        )

    def check_positions(
        self, position_ids: torch.Tensor | None, keys: torch.Tensor | None, seen: int, n: int
    ) -> None:
        """ValueError if the mechanism reads absolute positions (its ``absolute_positions()``:
        a prefix_lm mask mod, positional symbols; a mechanism declaring none reads none) and
        the call's positions are not seen..seen + n - 1, the ones it counts: `position_ids`
        (B, n) other ones, or `keys` (`split_mask`'s padding mask) with padding before a real
        token (left padding: the padding counted as positions)."""
        declared = getattr(self.mechanism, "absolute_positions", None)
        what = declared() if callable(declared) else None
        if what is None:
            return
        span = f"{seen}..{seen + n - 1}"
        plain = None if position_ids is None else torch.arange(seen, seen + n).to(position_ids)
        if plain is not None and not torch.equal(position_ids, plain.expand_as(position_ids)):
            why = f"position_ids are not {span}"
        elif keys is not None and (~keys[..., :-1] & keys[..., 1:]).any():
            why = "the batch is left-padded: padding before real tokens"
        else:
            return
        raise ValueError(
            f"layer {self.layer_idx}: {type(self.mechanism).__name__}'s {what} reads absolute "
            f"positions, which it counts as {span}, and this call's are others ({why}). Pad on "
            "the right (a forward pass), run each sequence alone (generate), or use a mechanism "
            "reading relative positions only (RoPE, a sliding_window, alibi or softcap mod, "
            "position_relative or symbolic_attention symbols)"
        )

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}, rope={self.rope}, padded_cache={self.padded_cache}"


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a supported model (a causal LM or its base model); ValueError
    naming the model's type otherwise, its attention implementation if its masks are not ones
    `split_mask` reads, or its head_dim if it is not hidden_size // num_attention_heads."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        raise ValueError(
            f"swap_attention supports transformers models of model_type {', '.join(SUPPORTED)}; "
            f"got {type(model).__name__} (model_type {model_type!r})"
        )
    implementation = config._attn_implementation
    if implementation not in IMPLEMENTATIONS and not str(implementation).startswith("attn_zoo_"):
        raise ValueError(
            f"attn_implementation {implementation!r}: swapped attention reads the 4-D masks of "
            f"{', '.join(IMPLEMENTATIONS)} and attn_zoo_<backend>; load the model with one of them"
        )
    width = config.hidden_size // config.num_attention_heads
    if head_dim(config) != width:
        raise ValueError(
            f"config.head_dim={config.head_dim}: swapped attention supports heads of width "
            f"hidden_size // num_attention_heads = {config.hidden_size} // "
            f"{config.num_attention_heads} = {width} only (every mechanism's heads are "
            "d_model // n_heads wide, so the model's projections and rotary tables would not fit)"
        )
    return getattr(model, "model", model).layers


def check_layers(layers: Iterable[int] | None, count: int) -> list[int]:
    """The chosen layer indices (all when None), each an int in 0..count-1, once."""
    if layers is None:
        return list(range(count))
    chosen = list(layers)
    valid = all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count for i in chosen)
    if not chosen or not valid or len(set(chosen)) != len(chosen):
        raise ValueError(
            f"layers={layers!r}: must be None (every layer) or distinct layer indices in "
            f"0..{count - 1}"
        )
    return chosen


def mechanism_settings(mechanism: str, config, layer_idx: int, kwargs: dict) -> dict:
    """Build kwargs: the model's d_model, n_heads, n_kv_heads, dropout and layer (1-based
    depth) where `mechanism` accepts them (d_model and n_heads where it takes **kwargs), then
    the caller's `kwargs`. Heads are the model's divided by the mechanism's
    `model_heads_per_head` where both counts divide (differential: half, so each of its
    heads is two of the model's, as wide as the model's, and takes its rotary tables)."""
    accepted = MECHANISMS.kwargs(mechanism)
    per = getattr(mechanism_class(mechanism), "model_heads_per_head", 1)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % per == 0 and kv_heads % per == 0:
        heads, kv_heads = heads // per, kv_heads // per
    model = {
        "d_model": config.hidden_size,
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "dropout": config.attention_dropout,
        "layer": layer_idx + 1,
    }
    names = ("d_model", "n_heads") if accepted is None else accepted
    return {**{k: v for k, v in model.items() if k in names}, **kwargs}


def head_dim(config) -> int:
    """The width of the model's attention heads (what its rotary tables cover)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def probe(module: nn.Module, config, rope: bool, padded_cache: bool = False) -> str | None:
    """None if `module` serves a causal call of 3 positions (the model's rotary tables applied
    if `rope`; with `padded_cache`, a cached call with the first key padded) and returns
    (1, 3, d_model), else why not."""
    if rope and "rope" not in inspect.signature(module.forward).parameters:
        return f"{type(module).__name__}.forward takes no rope argument"
    weight = next(module.parameters())
    x = torch.randn(1, 3, config.hidden_size, generator=torch.Generator().manual_seed(0))
    x = x.to(weight)
    call = {"attn_mask": None, "is_causal": True}
    if rope:
        ones = x.new_ones(1, 3, head_dim(config))
        call["rope"] = ModelRotary(ones, ones * 0)
    if padded_cache:
        padding = torch.tensor([False, True, True], device=x.device).view(1, 1, 1, 3)
        call.update(cache=LayerCache(), attn_mask=padding)
    try:
        with torch.no_grad():
            out = module(x, **call)
    except Exception as err:  # any failure is the answer, relayed to the caller
        return f"{type(err).__name__}: {err}"
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return f"it returned {shape} for x {tuple(x.shape)} (needs the same shape)"
    return None


@torch.no_grad()
def copy_projections(old: nn.Module, new: nn.Module) -> list[str]:
    """Start `new`'s projections from `old`'s (an nn.Linear each) where the weight shapes
    agree (`PROJECTIONS`), biases as the model's (module docstring); returns each of `old`'s
    projections that starts none, with why ("q_proj (64, 64): wq is (32, 64)")."""
    not_copied = []
    for source_name, names in PROJECTIONS.items():
        source = getattr(old, source_name)
        shape = tuple(source.weight.shape)
        name = next((t for t in names if hasattr(new, t)), None)
        if name is None:
            not_copied.append(f"{source_name} {shape}: no {' or '.join(names)}")
            continue
        target = getattr(new, name)
        if not isinstance(target, nn.Linear) or target.weight.shape != source.weight.shape:
            got = tuple(target.weight.shape) if isinstance(target, nn.Linear) else "no Linear"
            not_copied.append(f"{source_name} {shape}: {name} is {got}")
            continue
        target.weight.copy_(source.weight)
        if source.bias is not None and target.bias is None:
            target.bias = nn.Parameter(torch.empty_like(source.bias))
        if target.bias is not None:
            target.bias.copy_(source.bias if source.bias is not None else 0.0)
    return not_copied


@torch.no_grad()
def start_from_model(old: nn.Module, new: nn.Module) -> list[str]:
    """Start `new` from the model's attention `old`: its projections (`copy_projections`);
    dual attention combined by sum (attn_zoo/mechanisms/dual.py: out = SA(x) + RA(x, s)) has
    its self-attention branch's copied and its relational branch's output projection (and
    bias) zeroed, so RA(x, s) = 0: the relational heads are added to the model's heads
    contributing nothing, and the layer gives the model's output where all four copied.
    Returns what `copy_projections` returns (a dual's: "of its self-attention branch")."""
    dual_sum = isinstance(new, DualAttention) and new.combine == "sum"
    if not dual_sum or new.self_attention is None:
        return copy_projections(old, new)
    not_copied = copy_projections(old, new.self_attention)
    if new.relational_attention is not None:
        for param in new.relational_attention.wo.parameters():
            param.zero_()
    return [f"{why} (of its self-attention branch)" for why in not_copied]


def own_config(model: nn.Module) -> object:
    """A copy of `model.config` put in place of the original on every module of `model` that
    holds it: the swap's record (`RECORD`) then reaches this model only, not another model
    built from the same config object."""
    shared, config = model.config, copy.deepcopy(model.config)
    for module in model.modules():
        if getattr(module, "config", None) is shared:
            module.config = config
    return config


def swap_attention(
    model: nn.Module,
    mechanism: str,
    layers: Iterable[int] | None = None,
    *,
    rope: bool | str = "auto",
    backend: str = "auto",
    **kwargs,
) -> nn.Module:
    """Replace the self-attention of every decoder layer of `model` (or of `layers`) by the
    registered mechanism `mechanism` built with `kwargs` (plus the model's d_model, heads, ...:
    `mechanism_settings`) on `backend`; returns `model`, changed in place.

    rope: "auto" applies the model's rotary tables where the mechanism takes them, True
    refuses a mechanism that does not, False never applies them (module docstring). Every
    argument is checked, and every layer's mechanism built and probed, before any layer
    changes: a ValueError names the bad one and what would be valid."""
    if not (rope == "auto" or isinstance(rope, bool)):
        raise ValueError(f"rope={rope!r}: must be 'auto', True or False")
    blocks = decoder_layers(model)
    chosen = check_layers(layers, len(blocks))
    swapped = [i for i in chosen if isinstance(blocks[i].self_attn, SwappedAttention)]
    if swapped:
        raise ValueError(
            f"layers {swapped} of the model are swapped already (to "
            f"{blocks[swapped[0]].self_attn.mechanism.__class__.__name__}): swap the original "
            "model's layers (build or load it again), or choose other layers"
        )
    mechanism_class(mechanism).check_backend(backend)
    MECHANISMS.check_kwargs(mechanism, kwargs)
    try:
        json.dumps(kwargs)
    except TypeError as err:
        raise ValueError(
            f"kwargs of {mechanism!r} must be JSON values (they are recorded in the model's "
            f"config for load_swapped): {err}"
        ) from err
    config = model.config
    built = {}
    for i in chosen:
        settings = mechanism_settings(mechanism, config, i, kwargs)
        try:
            module = build(mechanism, backend=backend, **settings)
        except TypeError as err:  # e.g. a required argument missing
            raise ValueError(
                f"cannot build mechanism {mechanism!r} with {settings}: {err} (it accepts "
                f"{MECHANISMS.kwargs(mechanism)})"
            ) from err
        weight = next(blocks[i].self_attn.parameters())
        built[i] = module.to(device=weight.device, dtype=weight.dtype)
    first = built[chosen[0]]
    refused = None if rope is False else probe(first, config, rope=True)
    if rope is True and refused is not None:
        raise ValueError(
            f"rope=True: mechanism {mechanism!r} cannot take the model's RoPE: {refused}"
        )
    takes_rope = rope is not False and refused is None
    failure = probe(first, config, rope=takes_rope)
    if failure is not None:
        raise ValueError(
            f"mechanism {mechanism!r} with {kwargs} cannot be a causal LM's self-attention: "
            f"{failure}"
        )
    if rope == "auto" and not takes_rope:
        log.warning(
            "swap_attention: %r runs without the model's rotary positions (%s)", mechanism, refused
        )
    cached = keeps_cache(first)
    padded_cache = cached and probe(first, config, takes_rope, padded_cache=True) is None
    for i, module in built.items():
        not_copied = start_from_model(blocks[i].self_attn, module)
        swap = SwappedAttention(module, i, takes_rope, padded_cache, config)
        blocks[i].self_attn = swap.train(blocks[i].self_attn.training)  # the layer's mode
    if not_copied:  # the same in every layer: one mechanism, one config
        log.warning(
            "swap_attention: %r starts from none of these model projections: %s",
            mechanism, "; ".join(not_copied),
        )  # fmt: skip
    if not cached and getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = False  # generate recomputes (module docstring)
    record = dict(mechanism=mechanism, layers=chosen, kwargs=kwargs, backend=backend)
    config = own_config(model)
    setattr(config, RECORD, [*getattr(config, RECORD, []), {**record, "rope": takes_rope}])
    return model


def swapped_mechanisms(model: nn.Module) -> dict[int, AttentionMechanism]:
    """{layer index: mechanism} of every swapped layer of `model`."""
    return {
        i: block.self_attn.mechanism
        for i, block in enumerate(decoder_layers(model))
        if isinstance(block.self_attn, SwappedAttention)
    }


def saved_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights ``save_pretrained`` wrote in `folder`, as transformers reads them:
    model.safetensors, else each tensor from the shard model.safetensors.index.json names
    for it; any other *.safetensors (a stale copy) is not read. ValueError naming the folder
    if it holds neither, or a shard the index names is missing."""
    from safetensors.torch import load_file
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

    single, index = folder / SAFE_WEIGHTS_NAME, folder / SAFE_WEIGHTS_INDEX_NAME
    if single.is_file():
        return load_file(single)
    if not index.is_file():
        raise ValueError(
            f"{folder}: neither {SAFE_WEIGHTS_NAME} nor {SAFE_WEIGHTS_INDEX_NAME} (the weights "
            "save_pretrained writes, with its default safe_serialization)"
        )
    weight_map = json.loads(index.read_text())["weight_map"]  # tensor name -> shard file
    missing = sorted({shard for shard in weight_map.values() if not (folder / shard).is_file()})
    if missing:
        raise ValueError(f"{index} names shards {missing} that {folder} does not hold")
    shards = {shard: load_file(folder / shard) for shard in set(weight_map.values())}
    return {name: shards[shard][name] for name, shard in weight_map.items()}


def load_swapped(folder: str | Path, **from_config) -> nn.Module:
    """The swapped causal LM saved in `folder` by ``save_pretrained``: built from its
    config.json (`from_config`: more `AutoModelForCausalLM.from_config` arguments), its swaps
    (``config.attn_zoo_surgery``) replayed, its weights loaded (`saved_weights`), in their
    dtype. A mechanism from a plugin must be registered first (import the plugin)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    swaps = getattr(config, RECORD, None)
    if not swaps:
        raise ValueError(
            f"{folder / 'config.json'} records no attention swap ({RECORD}): load it with "
            "AutoModelForCausalLM.from_pretrained"
        )
    state = saved_weights(folder)
    dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    setattr(config, RECORD, [])
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, **from_config)
    for swap in swaps:
        swap_attention(
            model, swap["mechanism"], swap["layers"], rope=swap["rope"],
            backend=swap["backend"], **swap["kwargs"],
        )  # fmt: skip
    loaded = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    present = {id(params[k]) for k in state if k in params}
    missing = [k for k in loaded.missing_keys if id(params.get(k)) not in present]  # not tied
    if missing or loaded.unexpected_keys:
        raise ValueError(
            f"{folder}: the weights do not fit the swapped model: missing {missing}, "
            f"unexpected {loaded.unexpected_keys}"
        )
    return model.eval()


__all__ = [
    "ModelRotary",
    "SwappedAttention",
    "load_swapped",
    "swap_attention",
    "swapped_mechanisms",
]
