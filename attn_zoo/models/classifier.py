"""A sequence classifier on the generic block: token sequence -> one label.

    h = token_embedding(idx) + positions;  h = block_l(h, symbols_l(h))   (non-causal)
    logits = final_out(norm(pool(h)))       pool: mean over positions, the first token, or
                                            "flatten": every position's norm(h) concatenated,
                                            (B, max_len * d_model), each position kept apart
                                            (sequences of length max_len only)

With `input_dim`, the inputs are vectors (B, T, input_dim), e.g. objects drawn fresh for each
example, embedded by a linear map instead of a token table.

For the relational tasks of the Abstractor / Dual Attention Transformer line of work
(match_pattern, same_pair, ...), with any registered attention mechanism.
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

POOLS = ("mean", "first", "flatten")


class SequenceClassifier(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        d_model: int | None = None,
        n_layers: int = 1,
        max_len: int = 512,
        pos_enc: str = "learned",
        pool: str = "mean",
        config: BlockConfig | None = None,
        input_dim: int | None = None,
        **block_settings,
    ):
        """block_settings: `BlockConfig` fields (attention, attention_kwargs, dff, ...), or a
        whole `config`; the blocks are never causal. pool: "mean", "first" or "flatten".
        input_dim: the width of vector inputs (then `vocab_size` is not used)."""
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool={pool!r}: valid are {', '.join(map(repr, POOLS))}")
        if d_model is not None:
            block_settings["d_model"] = d_model
        c = BlockConfig.resolve(config, **block_settings, causal=False)
        self.config = c
        self.vocab_size, self.max_len, self.pool = vocab_size, max_len, pool
        if input_dim is not None and (isinstance(input_dim, bool) or input_dim < 1):
            raise ValueError(f"input_dim={input_dim!r}: must be None or an integer >= 1")
        self.input_dim = input_dim
        self.token_embedder = (
            nn.Embedding(vocab_size, c.d_model)
            if input_dim is None
            else nn.Linear(input_dim, c.d_model, bias=False)
        )
        self.dropout = nn.Dropout(c.dropout)
        self.symbol_retriever = symbol_retrievers(c, n_layers)
        self.blocks = make_blocks(n_layers, c)
        self.pos_enc = sequence_positions(pos_enc, c.d_model, max_len, self.blocks)
        self.norm = create_norm(c.d_model, c.norm_type)
        width = c.d_model * (max_len if pool == "flatten" else 1)
        self.final_out = nn.Linear(width, num_classes)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids, or (B, T, input_dim) vectors -> logits (B, num_classes) and
        the mean cross-entropy loss."""
        if self.input_dim is None:
            check_tokens("idx", idx, self.vocab_size, self.max_len)
        elif idx.dim() != 3 or idx.shape[2] != self.input_dim or not idx.is_floating_point():
            raise ValueError(
                f"idx must be (B, T, {self.input_dim}) float vectors (input_dim), got "
                f"{idx.dtype} {tuple(idx.shape)}"
            )
        elif idx.shape[1] > self.max_len:
            raise ValueError(f"idx has length {idx.shape[1]} > max_len={self.max_len}")
        if self.pool == "flatten" and idx.shape[1] != self.max_len:
            raise ValueError(
                f"pool='flatten' reads sequences of length max_len={self.max_len}, got "
                f"{idx.shape[1]}"
            )
        h = self.dropout(self.pos_enc(self.token_embedder(idx)))
        h = run_blocks(
            self.blocks, self.symbol_retriever, h, rope=self.pos_enc.rotary(idx.shape[1])
        )
        if self.pool == "flatten":
            logits = self.final_out(self.norm(h).flatten(1))
        else:
            pooled = h.mean(dim=1) if self.pool == "mean" else h[:, 0]
            logits = self.final_out(self.norm(pooled))
        return logits, None if targets is None else F.cross_entropy(logits, targets)
