"""A sequence classifier on the generic block: token sequence -> one label.

    h = token_embedding(idx) + positions;  h = block_l(h, symbols_l(h))   (non-causal)
    logits = final_out(norm(pool(h)))       pool: mean over positions, or the first token

For the relational tasks of the Abstractor / Dual Attention Transformer line of work
(match_pattern, same_pair, ...), with any registered attention mechanism.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_zoo.models.common import (
    check_tokens,
    make_blocks,
    run_blocks,
    sequence_positions,
    symbol_retrievers,
)
from attn_zoo.nn.norms import create_norm


class SequenceClassifier(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        d_model: int,
        n_layers: int,
        attention: str = "standard",
        attention_kwargs: dict | None = None,
        dff: int | None = None,
        activation: str = "relu",
        dropout: float = 0.0,
        norm_first: bool = True,
        norm_type: str = "layernorm",
        max_len: int = 512,
        pos_enc: str = "learned",
        pool: str = "mean",
        symbol_retrieval: str | None = None,
        symbol_retrieval_kwargs: dict | None = None,
        shared_symbol_retriever: bool = True,
        backend: str = "auto",
    ):
        super().__init__()
        if pool not in ("mean", "first"):
            raise ValueError(f"pool={pool!r}: valid are 'mean', 'first'")
        self.vocab_size, self.max_len, self.pool = vocab_size, max_len, pool
        self.token_embedder = nn.Embedding(vocab_size, d_model)
        self.dropout = nn.Dropout(dropout)
        self.symbol_retriever = symbol_retrievers(
            symbol_retrieval, symbol_retrieval_kwargs, d_model, n_layers, shared_symbol_retriever
        )
        self.blocks = make_blocks(
            n_layers, d_model=d_model, attention=attention, attention_kwargs=attention_kwargs,
            dff=dff, activation=activation, dropout=dropout, norm_first=norm_first,
            norm_type=norm_type, causal=False, backend=backend,
        )  # fmt: skip
        self.pos_enc = sequence_positions(pos_enc, d_model, max_len, self.blocks)
        self.norm = create_norm(d_model, norm_type)
        self.final_out = nn.Linear(d_model, num_classes)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> logits (B, num_classes) and the mean cross-entropy loss."""
        check_tokens("idx", idx, self.vocab_size, self.max_len)
        h = self.dropout(self.pos_enc(self.token_embedder(idx)))
        h = run_blocks(
            self.blocks, self.symbol_retriever, h, rope=self.pos_enc.rotary(idx.shape[1])
        )
        pooled = h.mean(dim=1) if self.pool == "mean" else h[:, 0]
        logits = self.final_out(self.norm(pooled))
        return logits, None if targets is None else F.cross_entropy(logits, targets)
