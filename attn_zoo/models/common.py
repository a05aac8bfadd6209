"""Pieces the model family shares: block stacks, symbol retrievers, input checks."""

from __future__ import annotations

import torch
from torch import nn

from attn_zoo.models.block import Block, BlockConfig
from attn_zoo.models.positional import build_positional
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


def symbol_retrievers(config: BlockConfig, n_layers: int) -> nn.Module | None:
    """None, one retriever shared by all layers, or a ModuleList of one per layer."""
    if config.symbol_retrieval is None:
        return None
    kwargs = config.symbol_retrieval_kwargs or {}
    if config.shared_symbol_retriever:
        return build_symbol_retriever(config.symbol_retrieval, config.d_model, **kwargs)
    return nn.ModuleList(
        build_symbol_retriever(config.symbol_retrieval, config.d_model, **kwargs)
        for _ in range(n_layers)
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


def make_blocks(n_layers: int, config: BlockConfig) -> nn.ModuleList:
    """`n_layers` blocks of `config` (n_layers >= 1)."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers={n_layers!r}: must be an integer >= 1")
    return nn.ModuleList(Block(config) for _ in range(n_layers))


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
