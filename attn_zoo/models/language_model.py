"""A decoder-only language model on the generic block, with any attention mechanism.

    h = token_embedding(idx) [+ positions];  h = block_l(h, symbols_l(h)) for each layer
    logits = final_out(norm(h));   loss = cross_entropy(logits, targets, ignore_index=-1)

Causal in every layer; tied input/output embeddings by default; symbols for relational and
dual attention from a retriever shared across layers (the reference's default) or one per
layer. `LanguageModel.generate` samples with temperature and top-k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_zoo.models.block import BlockConfig
from attn_zoo.models.common import (
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
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> logits (B, T, vocab) and the mean loss (targets -1 ignored)."""
        check_tokens("idx", idx, self.vocab_size, self.max_block_size)
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(
                f"targets {tuple(targets.shape)} must have idx's shape {tuple(idx.shape)}"
            )
        h = self.dropout(self.pos_enc(self.token_embedder(idx)))
        h = run_blocks(
            self.blocks, self.symbol_retriever, h, rope=self.pos_enc.rotary(idx.shape[1])
        )
        logits = self.final_out(self.norm(h))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
    ) -> torch.Tensor:
        """Append `max_new_tokens` sampled tokens to idx (B, T); the context is cropped to
        the last max_block_size tokens. temperature 0 is greedy."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.max_block_size :])
            logits = logits[:, -1, :]
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
