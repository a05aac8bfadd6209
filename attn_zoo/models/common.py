"""Pieces the model family shares: block stacks, symbol retrievers, input checks."""

from __future__ import annotations

import torch
from torch import nn

from attn_zoo.nn.block import Block
from attn_zoo.nn.positional import build_positional
from attn_zoo.symbols import build_symbol_retriever


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


def symbol_retrievers(
    name: str | None, kwargs: dict | None, d_model: int, n_layers: int, shared: bool
) -> nn.Module | None:
    """None, one retriever shared by all layers, or a ModuleList of one per layer."""
    if name is None:
        return None
    if shared:
        return build_symbol_retriever(name, d_model, **(kwargs or {}))
    return nn.ModuleList(
        build_symbol_retriever(name, d_model, **(kwargs or {})) for _ in range(n_layers)
    )


def retriever_for(retrievers: nn.Module | None, layer: int) -> nn.Module | None:
    if retrievers is None or not isinstance(retrievers, nn.ModuleList):
        return retrievers
    return retrievers[layer]


def run_blocks(blocks: nn.ModuleList, retrievers, h: torch.Tensor, **call) -> torch.Tensor:
    """Each block in turn; symbols, if any, from the residual stream entering the block."""
    for i, block in enumerate(blocks):
        retriever = retriever_for(retrievers, i)
        symbols = None if retriever is None else retriever(h)
        h = block(h, symbols, **call)
    return h


def make_blocks(n_layers: int, **block_kwargs) -> nn.ModuleList:
    return nn.ModuleList(Block(**block_kwargs) for _ in range(n_layers))


def check_tokens(name: str, idx: torch.Tensor, vocab_size: int, max_len: int | None) -> None:
    """idx must be (B, T) integer token ids in [0, vocab_size), T <= max_len."""
    if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"{name} must be (B, T) integer token ids, got {idx.dtype} {tuple(idx.shape)}"
        )
    if max_len is not None and idx.shape[1] > max_len:
        raise ValueError(f"{name} has length {idx.shape[1]} > max_block_size={max_len}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= vocab_size):
        raise ValueError(
            f"{name} has token ids in [{int(idx.min())}, {int(idx.max())}]; "
            f"valid ids are 0..{vocab_size - 1}"
        )
