"""Pieces the model family shares: block stacks, symbol retrievers, input checks."""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

from attn_zoo.mechanisms.cache import Cache
from attn_zoo.mechanisms.registry import mechanism_kwargs
from attn_zoo.models.block import Block, BlockConfig
from attn_zoo.models.positional import build_positional
from attn_zoo.symbols import build_symbol_retriever
from attn_zoo.symbols.retrievers import cacheable, retrieve


def rope_width(module: nn.Module) -> int:
    """The attention key width of the first mechanism in `module` that has one (for RoPE)."""
    for sub in module.modules():
        if hasattr(sub, "key_dim"):
            return sub.key_dim
    raise ValueError(f"RoPE needs an attention with a key width; {type(module).__name__} has none")


def sequence_positions(
    pos_enc: str, d_model: int, max_len: int, blocks: nn.ModuleList
) -> nn.Module:
    """Positional encoding `pos_enc`; RoPE takes the key width of blocks[0]'s attention."""
    rope = {"rope_dim": rope_width(blocks[0].attn)} if pos_enc.startswith("rope") else {}
    return build_positional(pos_enc, d_model, max_len, **rope)


def symbol_retrievers(config: BlockConfig, n_layers: int) -> nn.Module | None:
    """None, one retriever shared by all layers, or a ModuleList of one per layer. Loading a
    state dict of the other kind (``symbol_retriever.<i>.*`` keys into a shared retriever,
    ``symbol_retriever.<name>`` into per-layer ones) fails naming the keys."""
    if config.symbol_retrieval is None:
        return None
    kwargs = config.symbol_retrieval_kwargs or {}
    if config.shared_symbol_retriever:
        shared = build_symbol_retriever(config.symbol_retrieval, config.d_model, **kwargs)
        shared.register_load_state_dict_pre_hook(_refuse_per_layer_retrievers)
        return shared
    per_layer = nn.ModuleList(
        build_symbol_retriever(config.symbol_retrieval, config.d_model, **kwargs)
        for _ in range(n_layers)
    )
    per_layer.register_load_state_dict_pre_hook(_refuse_a_shared_retriever)
    return per_layer


def _retriever_keys(state_dict, prefix: str, per_layer: bool) -> list[str]:
    """Keys under `prefix` that belong to per-layer retrievers (``<prefix><i>.``) or not."""
    layer = re.compile(re.escape(prefix) + r"\d+\.")
    return [k for k in state_dict if k.startswith(prefix) and bool(layer.match(k)) == per_layer]


def some_keys(keys: list[str], limit: int = 3) -> str:
    """The first `limit` keys, comma-separated, and how many more there are."""
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _refuse_per_layer_retrievers(module, state_dict, prefix, metadata, strict, missing,
                                 unexpected, error_msgs) -> None:  # fmt: skip
    """load_state_dict pre-hook of a shared retriever: per-layer keys are an error."""
    if keys := _retriever_keys(state_dict, prefix, per_layer=True):
        error_msgs.append(
            f"the state dict holds one symbol retriever per layer ({some_keys(keys)}) but this "
            "model shares one retriever across layers (shared_symbol_retriever=True): build it "
            "with shared_symbol_retriever=False"
        )


def _refuse_a_shared_retriever(module, state_dict, prefix, metadata, strict, missing,
                               unexpected, error_msgs) -> None:  # fmt: skip
    """load_state_dict pre-hook of per-layer retrievers: a shared retriever's keys are an
    error."""
    if keys := _retriever_keys(state_dict, prefix, per_layer=False):
        error_msgs.append(
            f"the state dict holds one symbol retriever shared across layers ({some_keys(keys)}) "
            "but this model has one per layer (shared_symbol_retriever=False): build it with "
            "shared_symbol_retriever=True"
        )


def retriever_for(retrievers: nn.Module | None, layer: int) -> nn.Module | None:
    if retrievers is None or not isinstance(retrievers, nn.ModuleList):
        return retrievers
    return retrievers[layer]


def run_blocks(
    blocks: nn.ModuleList, retrievers, h: torch.Tensor, cache: Cache | None = None, **call
) -> torch.Tensor:
    """Each block in turn; symbols, if any, from the residual stream entering the block. With
    a `cache` (cached decoding), h holds the positions after cache.length: each block gets its
    layer's cache and the retrievers that offset (the caller advances the cache)."""
    offset = 0 if cache is None else cache.length
    for i, block in enumerate(blocks):
        retriever = retriever_for(retrievers, i)
        symbols = None if retriever is None else retrieve(retriever, h, offset)
        if cache is not None:
            call["cache"] = cache[i]
        h = block(h, symbols, **call)
    return h


def blocks_support_cache(blocks: nn.ModuleList, retrievers) -> bool:
    """Whether cached decoding can run `blocks` with `retrievers`: every block's attention
    takes a cache and every retriever serves offset calls."""
    if not all(block.supports_cache for block in blocks):
        return False
    if isinstance(retrievers, nn.ModuleList):
        return all(cacheable(r) for r in retrievers)
    return cacheable(retrievers)


def make_blocks(n_layers: int, config: BlockConfig) -> nn.ModuleList:
    """`n_layers` blocks of `config` (n_layers >= 1)."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers={n_layers!r}: must be an integer >= 1")
    return nn.ModuleList(Block(at_depth(config, layer)) for layer in range(1, n_layers + 1))


def at_depth(config: BlockConfig, layer: int) -> BlockConfig:
    """`config` for the block at 1-based depth `layer`: a mechanism named in it that takes a
    `layer` keyword (differential attention: its lambda_init depends on depth) gets `layer`,
    unless its attention_kwargs set one."""
    kwargs = config.attention_kwargs or {}
    if not isinstance(config.attention, str) or "layer" in kwargs:
        return config
    if "layer" not in mechanism_kwargs(config.attention):
        return config
    return dataclasses.replace(config, attention_kwargs={**kwargs, "layer": layer})


def check_tokens(name: str, idx: torch.Tensor, vocab_size: int, max_len: int | None) -> None:
    """idx must be (B, T) integer token ids in [0, vocab_size), T <= max_len.

    Shape and dtype are checked on the host always. The id range is a check of tensor values:
    in eager mode it reads them (one host sync) to name the offending range; under
    torch.compile it becomes a device-side assertion (torch._assert_async, lowered by inductor
    to an in-kernel assert) so the compiled graph has no graph break and no host sync, and an
    out-of-range id still fails (a RuntimeError naming the valid ids on CPU, a device-side
    assert on CUDA, as an out-of-range embedding lookup is in eager mode).
    """
    if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"{name} must be (B, T) integer token ids, got {idx.dtype} {tuple(idx.shape)}"
        )
    if max_len is not None and idx.shape[1] > max_len:
        raise ValueError(f"{name} has length {idx.shape[1]} > max_block_size={max_len}")
    if not idx.numel():
        return
    if torch.compiler.is_compiling():
        in_range = (idx.min() >= 0) & (idx.max() < vocab_size)
        torch._assert_async(in_range, f"{name} has token ids outside 0..{vocab_size - 1}")
        return
    low, high = int(idx.min()), int(idx.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name} has token ids in [{low}, {high}]; valid ids are 0..{vocab_size - 1}"
        )
