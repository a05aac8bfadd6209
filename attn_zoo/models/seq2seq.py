"""An encoder-decoder on the generic block, with any attention mechanism in either stack.

    src: e = block_l(e, symbols(e))                  (non-causal encoder)
    tgt: d = block_l(d, symbols(d), context=e)       (causal decoder with cross-attention)
    logits = final_out([norm] d);   loss = cross_entropy(logits, targets, ignore_index)

Teacher forcing in `forward`; `greedy_decode` for inference. Embeddings are scaled by
sqrt(d_model) and get sinusoidal positions by default, as in the reference's Seq2Seq models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_zoo.models.block import BlockConfig
from attn_zoo.models.common import check_tokens, make_blocks, run_blocks, symbol_retrievers
from attn_zoo.models.norms import create_norm
from attn_zoo.models.positional import build_positional


class Seq2Seq(nn.Module):
    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int | None = None,
        n_layers_enc: int = 1,
        n_layers_dec: int = 1,
        encoder_attention: str = "standard",
        encoder_attention_kwargs: dict | None = None,
        decoder_attention: str = "standard",
        decoder_attention_kwargs: dict | None = None,
        cross_attention_kwargs: dict | None = None,
        in_block_size: int = 512,
        out_block_size: int = 512,
        pos_enc: str = "sinusoidal",
        scale_embeddings: bool = True,
        final_norm: bool = True,
        out_bias: bool = True,
        loss_ignore_idx: int = -1,
        out_dim: int | None = None,
        encoder_block_kwargs: dict | None = None,
        decoder_block_kwargs: dict | None = None,
        config: BlockConfig | None = None,
        **block_settings,
    ):
        """block_settings: `BlockConfig` fields both stacks share (dff, activation, dropout, ...),
        or a whole `config`; encoder_block_kwargs / decoder_block_kwargs: fields for one stack
        only (e.g. a different dff, or causal=False). cross_attention_kwargs: the decoder's
        standard cross-attention (default: n_heads of the decoder attention, or 1). out_dim:
        logits width (default tgt_vocab_size). One symbol retriever serves every layer."""
        super().__init__()
        if d_model is not None:
            block_settings["d_model"] = d_model
        c = BlockConfig.resolve(config, **block_settings, shared_symbol_retriever=True)
        self.config = c
        d_model = c.d_model
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.in_block_size, self.out_block_size = in_block_size, out_block_size
        self.loss_ignore_idx = loss_ignore_idx
        self.source_embedder = nn.Embedding(src_vocab_size, d_model)
        self.target_embedder = nn.Embedding(tgt_vocab_size, d_model)
        scale = {"scale": scale_embeddings} if pos_enc == "sinusoidal" else {}
        self.source_pos = build_positional(pos_enc, d_model, in_block_size, **scale)
        self.target_pos = build_positional(pos_enc, d_model, out_block_size, **scale)
        self.symbol_retriever = symbol_retrievers(c, 1)
        encoder = {"attention": encoder_attention, "attention_kwargs": encoder_attention_kwargs}
        self.encoder_blocks = make_blocks(
            n_layers_enc, BlockConfig.resolve(c, **{**encoder, **(encoder_block_kwargs or {})})
        )
        if cross_attention_kwargs is None:
            cross_attention_kwargs = {"n_heads": (decoder_attention_kwargs or {}).get("n_heads", 1)}
        decoder = {
            "attention": decoder_attention,
            "attention_kwargs": decoder_attention_kwargs,
            "causal": True,
            "cross_attention": cross_attention_kwargs,
        }
        decoder = BlockConfig.resolve(c, **{**decoder, **(decoder_block_kwargs or {})})
        self.decoder_blocks = make_blocks(n_layers_dec, decoder)
        self.norm = create_norm(d_model, c.norm_type if final_norm else "none")
        self.final_out = nn.Linear(d_model, out_dim or tgt_vocab_size, bias=out_bias)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src (B, S) token ids -> encoder states (B, S, d_model)."""
        check_tokens("src", src, self.src_vocab_size, self.in_block_size)
        e = self.source_pos(self.source_embedder(src))
        return run_blocks(self.encoder_blocks, self.symbol_retriever, e)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """tgt (B, T) token ids and encoder states -> logits (B, T, tgt_vocab)."""
        check_tokens("tgt", tgt, self.tgt_vocab_size, self.out_block_size)
        d = self.target_pos(self.target_embedder(tgt))
        d = run_blocks(self.decoder_blocks, self.symbol_retriever, d, context=memory)
        return self.final_out(self.norm(d))

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: logits (B, T, tgt_vocab) for every target position, and the loss."""
        logits = self.decode(tgt, self.encode(src))
        loss = None
        if targets is not None:
            if targets.shape != tgt.shape:
                raise ValueError(
                    f"targets {tuple(targets.shape)} must have tgt's shape {tuple(tgt.shape)}"
                )
            loss = F.cross_entropy(
                logits.flatten(0, 1), targets.reshape(-1), ignore_index=self.loss_ignore_idx
            )
        return logits, loss

    @torch.no_grad()
    def greedy_decode(
        self, src: torch.Tensor, start_token: int, max_new_tokens: int
    ) -> torch.Tensor:
        """(B, 1 + max_new_tokens): start_token then the argmax token at each step."""
        memory = self.encode(src)
        out = torch.full((src.shape[0], 1), start_token, dtype=torch.long, device=src.device)
        for _ in range(max_new_tokens):
            logits = self.decode(out, memory)
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return out
