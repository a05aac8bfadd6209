"""A decoder-only language model on the generic block, with any attention mechanism.

    h = token_embedding(idx) [+ positions];  h = block_l(h, symbols_l(h)) for each layer
    logits = final_out(norm(h));   loss = cross_entropy(logits, targets, ignore_index=-1)

Causal in every layer; tied input/output embeddings by default; symbols for relational and
dual attention from a retriever shared across layers (the reference's default) or one per
layer. `LanguageModel.generate` samples with temperature and top-k.

Cached decoding: ``forward(idx_new, cache=cache)`` (a `Cache` from `new_cache`) runs only
the tokens after the cache's `length` positions, at positions length.. (learned and sinusoidal
positions, RoPE tables and positional symbols offset), each layer's attention keeping what it
needs in its `LayerCache` (see attn_zoo.mechanisms.cache), and advances the cache. `generate` uses
it when every layer can (`supports_cache`; else, or with use_cache=False, it recomputes the
whole context for every token), and while the context fits max_block_size: past it the window
slides, every position moves, and it recomputes the cropped window as the uncached path does.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch
import torch.nn.functional as F
from torch import nn

from attn_zoo.mechanisms.cache import Cache
from attn_zoo.models.block import BlockConfig
from attn_zoo.models.common import (
    blocks_support_cache,
    check_tokens,
    make_blocks,
    run_blocks,
    sequence_positions,
    symbol_retrievers,
)
from attn_zoo.models.norms import create_norm


class LanguageModel(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        d_model: int | None = None,
        n_layers: int = 1,
        max_block_size: int = 1024,
        pos_enc: str = "learned",
        tie_weights: bool = True,
        config: BlockConfig | None = None,
        **block_settings,
    ):
        """block_settings: `BlockConfig` fields (attention, attention_kwargs, dff, ...), or a
        whole `config`; the blocks are always causal."""
        super().__init__()
        if d_model is not None:
            block_settings["d_model"] = d_model
        c = BlockConfig.resolve(config, **block_settings, causal=True)
        self.config = c
        self.vocab_size, self.max_block_size = vocab_size, max_block_size
        self.token_embedder = nn.Embedding(vocab_size, c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        self.symbol_retriever = symbol_retrievers(c, n_layers)
        self.blocks = make_blocks(n_layers, c)
        self.pos_enc = sequence_positions(pos_enc, c.d_model, max_block_size, self.blocks)
        self.norm = create_norm(c.d_model, c.norm_type)
        self.final_out = nn.Linear(c.d_model, vocab_size, bias=False)
        if tie_weights:
            self.token_embedder.weight = self.final_out.weight

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: Cache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> logits (B, T, vocab) and the mean loss (targets -1 ignored).
        With a `cache` (`new_cache`), idx are the tokens after its cached positions: they sit
        at positions cache.length.., attend to the cached ones too, and are cached."""
        check_tokens("idx", idx, self.vocab_size, self.max_block_size)
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(
                f"targets {tuple(targets.shape)} must have idx's shape {tuple(idx.shape)}"
            )
        offset = 0
        if cache is not None:
            if not self.supports_cache():
                raise ValueError(
                    "this model's attention (or symbol retriever) takes no cache; run with "
                    "cache=None (generate falls back by itself)"
                )
            if len(cache.layers) != len(self.blocks):
                raise ValueError(f"{cache!r} is not for a model of {len(self.blocks)} layers")
            offset = cache.length
            if offset + idx.shape[1] > self.max_block_size:
                raise ValueError(
                    f"{offset} cached + {idx.shape[1]} new positions exceed max_block_size="
                    f"{self.max_block_size}: crop and run without the cache"
                )
        t = idx.shape[1]
        h = self.dropout(self.pos_enc(self.token_embedder(idx), offset=offset))
        rope = self.pos_enc.rotary(t, offset=offset)
        h = run_blocks(self.blocks, self.symbol_retriever, h, cache=cache, rope=rope)
        if cache is not None:
            cache.advance(t)
        logits = self.final_out(self.norm(h))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def supports_cache(self) -> bool:
        """Whether every layer can decode with a cache (its attention and symbol retriever)."""
        return blocks_support_cache(self.blocks, self.symbol_retriever)

    def new_cache(self) -> Cache:
        """An empty cache for one batch of sequences (capacity max_block_size positions)."""
        return Cache(len(self.blocks), capacity=self.max_block_size)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        return_logits: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append `max_new_tokens` sampled tokens to idx (B, T); the context is cropped to
        the last max_block_size tokens. temperature 0 is greedy.

        use_cache: decode with a KV cache (or recurrent state) when the model supports it
        (`supports_cache`; otherwise the uncached path, silently); the first step runs the
        whole prompt (prefill), each later one only the newest token, until the context
        exceeds max_block_size, from where each step recomputes the cropped window as the
        uncached path does. return_logits: also the logits each step sampled from (before
        temperature and top-k), (B, max_new_tokens, vocab). Bad arguments are a ValueError
        before any compute (`_check_generation`)."""
        check_tokens("idx", idx, self.vocab_size, None)
        _check_generation(idx, max_new_tokens, temperature, top_k)
        cache = self.new_cache() if use_cache and self.supports_cache() else None
        steps = []
        for _ in range(max_new_tokens):
            if cache is not None and idx.shape[1] > self.max_block_size:
                cache = None  # the window slides: every position moves, recompute
            if cache is None:
                logits, _ = self(idx[:, -self.max_block_size :])
            else:
                logits, _ = self(idx[:, cache.length :], cache=cache)
            logits = logits[:, -1, :]
            if return_logits:
                steps.append(logits)
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat([idx, nxt], dim=1)
        if return_logits:
            if not steps:
                return idx, self.final_out.weight.new_zeros(idx.shape[0], 0, self.vocab_size)
            return idx, torch.stack(steps, dim=1)
        return idx


def _check_generation(
    idx: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None
) -> None:
    """ValueError naming the argument, its value and the valid range, unless the prompt idx
    (B, T) has T >= 1 tokens, max_new_tokens is an int >= 0, temperature a finite number >= 0
    (0: greedy) and top_k None or an int >= 1 (more than the vocabulary: all of it)."""

    def is_int(value: object) -> bool:
        return isinstance(value, Integral) and not isinstance(value, bool)

    if idx.shape[1] == 0:
        raise ValueError(f"idx {tuple(idx.shape)} has no tokens: the prompt needs T >= 1 tokens")
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be an int >= 0")
    if (
        not isinstance(temperature, Real)
        or isinstance(temperature, bool)
        or not (math.isfinite(temperature) and temperature >= 0)
    ):
        raise ValueError(
            f"temperature={temperature!r}: must be a finite number > 0, or 0 for greedy decoding"
        )
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k={top_k!r}: must be None (every token) or an int >= 1")
