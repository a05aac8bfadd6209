"""Port modules and checkpoints of the `dual-attention` package (Altabaa & Lafferty, v0.0.7).

    from attn_zoo.interop.dual_attention import port, convert_state_dict
    ours = port(reference_module)            # same outputs (float64: to 1e-10), our backends
    ours.load_state_dict(convert_state_dict(reference_checkpoint))
    out, attn, relations = port(reference_relational, returns="reference")(x, symbols)

Ported classes: Attention, RelationalAttention, DualAttention, SymbolicAttention,
PositionalSymbolRetriever, PositionRelativeSymbolRetriever (same parameter names); the
blocks EncoderBlock, DecoderBlock, DualAttnEncoderBlock, DualAttnDecoderBlock; the models
TransformerLM, DualAttnTransformerLM (and their _HFHub subclasses), Seq2SeqTransformer,
Seq2SeqDualAttnTransformer, VisionTransformer, VisionDualAttnTransformer, built by the
reference-compatible constructors of `dual_attention_models` (which reproduce the reference's
output-changing bugs, listed there). Checkpoints convert by renaming keys.

Calling convention: with use_relative_positional_symbols=True the reference's
RelationalAttention and DualAttention take the symbols as a dense (N, N, d_model) tensor; ours
take that too (backends naive and chunked; auto picks chunked), or the `RelativeSymbols` our
PositionRelativeSymbolRetriever returns (never expanded to N x N x d; every backend that reads
relative symbols). RoPE tables go in as ``rope=Rotary(cos, sin)``; arguments after `symbols`
are best passed by keyword (the reference's RelationalAttention has freqs_cos, freqs_sin
third and fourth, ours attn_mask and is_causal).

Returns: by default a ported attention module returns its output only. With
``port(module, returns="reference")`` it returns what the reference returns:
RelationalAttention (output, attention (B, H, N, N), relations (B, N, N, R)); DualAttention
(output, self-attention weights (B, H_sa, N, N) if called with need_weights=True else None,
[attention, relations] of the relational branch), None for an absent branch; Attention
(output, None); PositionRelativeSymbolRetriever the dense (N, N, d) symbols; Seq2Seq models
only the last position's logits when called without targets; vision models the logits alone.
The weights are those of the very pass (same projections, masks and RoPE; differentiable;
after dropout). Blocks, language models and the other retrievers return what the reference
returns either way.

Deliberate differences: a query row with no allowed key gives zeros here and NaN in the
reference (RelationalAttention, and Attention on its manual path); SymbolicAttention's
dropout acts in training only (the reference applies it in eval too), so a ported retriever
with dropout > 0 matches in eval only when the reference's dropout is 0. A full digest of the
reference is in dual_attention_reference.md beside this file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
from torch import nn

from attn_zoo.interop import dual_attention_models as builders
from attn_zoo.mechanisms import (
    AttentionMechanism,
    DualAttention,
    RelationalAttention,
    StandardAttention,
)
from attn_zoo.models.common import some_keys
from attn_zoo.registry import unknown_name_error
from attn_zoo.symbols import (
    PositionalSymbolRetriever,
    PositionRelativeSymbolRetriever,
    SymbolicAttention,
)
from attn_zoo.symbols.retrievers import check_returns


def _attributes(module: nn.Module, names: list[str]) -> dict:
    return {name: getattr(module, name) for name in names}


def _standard(m) -> nn.Module:
    kwargs = _attributes(
        m,
        [
            "d_model",
            "n_heads",
            "dropout",
            "key_dim",
            "n_kv_heads",
            "add_bias_kv",
            "add_bias_out",
            "total_n_heads",
        ],
    )
    return StandardAttention(**kwargs)


RELATIONAL_KWARGS = [
    "d_model", "n_heads", "n_relations", "dropout", "key_dim", "n_kv_heads", "rel_activation",
    "rel_proj_dim", "add_bias_kv", "add_bias_out", "total_n_heads", "symmetric_rels",
    "use_relative_positional_symbols",
]  # fmt: skip


def _relational(m) -> nn.Module:
    return RelationalAttention(**_attributes(m, RELATIONAL_KWARGS))


def _dual(m) -> nn.Module:
    kwargs = _attributes(
        m, ["d_model", "n_heads_sa", "n_heads_ra", "dropout", "share_attn_params", "ra_type"]
    )
    return DualAttention(**kwargs, sa_kwargs=dict(m.sa_kwargs), ra_kwargs=dict(m.ra_kwargs))


RETRIEVERS = {  # reference class -> (our registry name, constructor attributes)
    "SymbolicAttention": (
        "symbolic_attention",
        ["n_heads", "n_symbols", "dropout", "scale", "trainable_symbols"],
    ),
    "PositionalSymbolRetriever": ("positional_symbols", ["max_length", "sinusoidal"]),
    "PositionRelativeSymbolRetriever": ("position_relative", ["max_rel_pos"]),
}


def _retriever_settings(retriever: nn.Module) -> tuple[str, dict]:
    name = type(retriever).__name__
    if name not in RETRIEVERS:
        raise ValueError(f"symbol retriever {name} is not available in attn_zoo")
    ours, names = RETRIEVERS[name]
    return ours, _attributes(retriever, names)


def _cross_kwargs(attention: nn.Module) -> dict:
    return _attributes(attention, ["key_dim", "n_kv_heads", "add_bias_kv", "add_bias_out"])


BLOCK = [
    "d_model",
    "dff",
    "dropout_rate",
    "activation",
    "norm_first",
    "norm_type",
    "bias",
    "causal",
]
DUAL = ["n_heads_sa", "n_heads_ra", "ra_type", "share_attn_params"]


def _encoder_block(m):
    return builders.EncoderBlock(
        n_heads=m.n_heads, attn_kwargs=m.attn_kwargs, **_attributes(m, BLOCK)
    )


def _decoder_block(m):
    return builders.DecoderBlock(
        n_heads=m.n_heads, n_heads_cross=m.n_heads_cross, **_attributes(m, BLOCK)
    )


def _dual_branches(dual) -> dict:
    return dict(sa_kwargs=dict(dual.sa_kwargs), ra_kwargs=dict(dual.ra_kwargs))


def _dual_encoder_block(m):
    return builders.DualAttnEncoderBlock(
        **_attributes(m, BLOCK + DUAL), **_dual_branches(m.dual_attn)
    )


def _dual_decoder_block(m):
    return builders.DualAttnDecoderBlock(
        n_heads_cross=m.n_heads_cross,
        cross_kwargs=_cross_kwargs(m.cross_attn),
        **_attributes(m, BLOCK + DUAL),
        **_dual_branches(m.dual_attn),
    )


LM = [
    "vocab_size",
    "d_model",
    "n_layers",
    "dff",
    "dropout_rate",
    "activation",
    "norm_first",
    "norm_type",
    "bias",
    "pos_enc_type",
]


def _transformer_lm(m):
    return builders.TransformerLM(
        n_heads=m.n_heads,
        max_block_size=m.block_size,
        block_kwargs=m.block_kwargs,
        **_attributes(m, LM),
    )


def _dual_lm(m):
    name, kwargs = _retriever_settings(m.layers.symbol_retrievers[0])
    return builders.DualAttnTransformerLM(
        n_heads_sa=m.n_heads_sa,
        n_heads_ra=m.n_heads_ra,
        symbol_retrieval_kwargs=kwargs,
        max_block_size=m.block_size,
        ra_type=m.ra_type,
        share_attn_params=m.share_attn_params,
        symbol_retrieval=name,
        symbol_retriever_config=dict(m.symbol_retriever_config),
        **_dual_branches(m.layers.blocks[0].dual_attn),
        **_attributes(m, LM),
    )


SEQ2SEQ = [
    "input_spec", "output_spec", "d_model", "out_dim", "n_layers_enc", "n_layers_dec",
    "encoder_kwargs", "decoder_kwargs", "in_block_size", "out_block_size", "loss_ignore_idx",
]  # fmt: skip


def _seq2seq(m):
    return builders.Seq2SeqTransformer(**_attributes(m, SEQ2SEQ))


def _dual_seq2seq(m):
    name, kwargs = _retriever_settings(m.layers.symbol_retriever)
    return builders.Seq2SeqDualAttnTransformer(
        symbol_retrieval=name, symbol_retrieval_kwargs=kwargs, **_attributes(m, SEQ2SEQ)
    )


VISION = [
    "num_classes",
    "d_model",
    "n_layers",
    "dff",
    "dropout_rate",
    "activation",
    "norm_first",
    "norm_type",
    "bias",
    "pool",
]


def _vision_shapes(m) -> dict:
    return dict(
        image_shape=(m.img_channels, m.img_width, m.img_height),
        patch_size=(m.patch_width, m.patch_height),
    )


def _vit(m):
    return builders.VisionTransformer(
        n_heads=m.n_heads, **_vision_shapes(m), **_attributes(m, VISION)
    )


def _dual_vit(m):
    name, kwargs = _retriever_settings(m.symbol_retriever)
    return builders.VisionDualAttnTransformer(
        n_heads_sa=m.n_heads_sa,
        n_heads_ra=m.n_heads_ra,
        symbol_retrieval=name,
        symbol_retrieval_kwargs=kwargs,
        ra_type=m.ra_type,
        ra_kwargs=dict(m.ra_kwargs),
        sa_kwargs=dict(m.sa_kwargs),
        **_vision_shapes(m),
        **_attributes(m, VISION),
    )


PORTERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "Attention": _standard,
    "RelationalAttention": _relational,
    "DualAttention": _dual,
    "SymbolicAttention": lambda m: SymbolicAttention(
        **_attributes(
            m, ["d_model", "n_heads", "n_symbols", "dropout", "scale", "trainable_symbols"]
        )
    ),
    "PositionalSymbolRetriever": lambda m: PositionalSymbolRetriever(
        **_attributes(m, ["symbol_dim", "max_length", "sinusoidal"])
    ),
    "PositionRelativeSymbolRetriever": lambda m: PositionRelativeSymbolRetriever(
        **_attributes(m, ["symbol_dim", "max_rel_pos"])
    ),
    "EncoderBlock": _encoder_block,
    "DecoderBlock": _decoder_block,
    "DualAttnEncoderBlock": _dual_encoder_block,
    "DualAttnDecoderBlock": _dual_decoder_block,
    "TransformerLM": _transformer_lm,
    "DualAttnTransformerLM": _dual_lm,
    "Seq2SeqTransformer": _seq2seq,
    "Seq2SeqDualAttnTransformer": _dual_seq2seq,
    "VisionTransformer": _vit,
    "VisionDualAttnTransformer": _dual_vit,
}
for _hub in ("TransformerLM", "DualAttnTransformerLM"):  # the hub-mixin subclasses of hf.py
    PORTERS[f"{_hub}_HFHub"] = PORTERS[_hub]

RENAMES = [  # reference key pattern -> ours, applied in order
    (r"^_orig_mod\.", ""),
    (r"^layers\.", ""),
    (r"(^|\.)(self_attn|dual_attn)\.", r"\1attn."),
    (r"^positional_embedder\.weight$", "pos_enc.embedding.weight"),
    (r"^to_patch_embedding\.", "patch_embedding."),
    (r"^source_pos_embedder\.", "source_pos."),
    (r"^target_pos_embedder\.", "target_pos."),
]


def convert_state_dict(
    state_dict: Mapping[str, torch.Tensor], like: nn.Module | None = None
) -> dict[str, torch.Tensor]:
    """A reference checkpoint's state dict in our names.

    Accepts torch.compile's ``_orig_mod.`` prefix and de-duplicated state dicts such as
    safetensors writes for the hub mixin (a tied embedding or a shared retriever stored once).
    `like`: the target model, to tell a shared symbol retriever from per-layer ones; without
    it, per-layer retrievers stored once or as one storage count as shared. With it, a
    checkpoint whose retrievers do not fit `like` (per-layer ones into a shared retriever, a
    shared one into per-layer retrievers) is a ValueError naming the keys; so is a retriever
    key not of the form ``symbol_retrievers.<layer>.<parameter>``.
    """
    out = {}
    for key, value in state_dict.items():
        for pattern, repl in RENAMES:
            key = re.sub(pattern, repl, key)
        if not key.startswith("target_embedder.weights."):  # reference: alias of final_out
            out[key] = value
    if "cls_token" in out:  # vision models: the reference's encoder_blocks are our blocks
        out = {re.sub(r"^encoder_blocks\.", "blocks.", k): v for k, v in out.items()}
    out = _merge_retrievers(out, like)
    tied = ("token_embedder.weight", "final_out.weight")
    if "token_embedder.weight" in out or "final_out.weight" in out:
        for a, b in (tied, tied[::-1]):
            if a not in out and b in out and (like is None or a in like.state_dict()):
                out[a] = out[b]  # a tied embedding saved once
    return out


RETRIEVER_KEY = re.compile(r"symbol_retrievers\.(\d+)\.(\w.*)")


def _merge_retrievers(sd: dict, like: nn.Module | None) -> dict:
    """symbol_retrievers.{i}.* -> symbol_retriever.* (shared) or symbol_retriever.{i}.*.

    The checkpoint's retriever is shared when each parameter is one tensor in every layer that
    lists it (the reference's ``[retriever] * n_layers``, or stored once). With `like`, it must
    be what `like` has: into a shared retriever, every layer's values equal; into L per-layer
    retrievers (L > 1), not a shared one. Else ValueError naming the keys.
    """
    per_layer = {k: v for k, v in sd.items() if k.startswith("symbol_retrievers.")}
    if not per_layer:
        return sd
    rest = {k: v for k, v in sd.items() if k not in per_layer}
    split = []
    for key in per_layer:
        match = RETRIEVER_KEY.fullmatch(key)
        if match is None:
            raise ValueError(
                f"checkpoint key {key!r}: a symbol retriever key must be "
                "'symbol_retrievers.<layer>.<parameter>' (e.g. 'symbol_retrievers.0.q_proj.weight')"
            )
        split.append((int(match[1]), match[2]))
    by_name: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for (_, name), (key, value) in zip(split, per_layer.items(), strict=True):
        by_name.setdefault(name, []).append((key, value))
    one_tensor = all(
        len({v.untyped_storage().data_ptr() for _, v in entries}) == 1
        for entries in by_name.values()
    )
    shared = one_tensor
    if like is not None:
        target = getattr(like, "symbol_retriever", None)
        shared = not isinstance(target, nn.ModuleList)
        if shared:
            _check_one_retriever(by_name)
        elif len(target) > 1 and one_tensor:
            raise ValueError(
                f"the checkpoint holds one symbol retriever shared by every layer (keys "
                f"{some_keys(list(per_layer))}: one tensor per parameter) but the model has "
                f"one per layer ({len(target)} retrievers): build it with "
                "shared_symbol_retriever=True"
            )
    for (index, name), value in zip(split, per_layer.values(), strict=True):
        rest[f"symbol_retriever.{name}" if shared else f"symbol_retriever.{index}.{name}"] = value
    return rest


def _check_one_retriever(by_name: dict[str, list[tuple[str, torch.Tensor]]]) -> None:
    """ValueError unless every parameter has the same value in every layer listing it."""
    differing = [
        (entries[0][0], key)
        for entries in by_name.values()
        for key, value in entries[1:]
        if value.shape != entries[0][1].shape or not torch.equal(value, entries[0][1])
    ]
    if differing:
        pairs = ", ".join(f"{b} != {a}" for a, b in differing[:3])
        more = f" (and {len(differing) - 3} more)" if len(differing) > 3 else ""
        raise ValueError(
            f"the checkpoint holds one symbol retriever per layer ({pairs}{more}) but the model "
            "shares one retriever across layers: build it with shared_symbol_retriever=False"
        )


def _attention_returns(module, args, kwargs, output):
    return output, None  # the reference's default (SDPA) path returns no weights


def _seq2seq_returns(module, args, kwargs, output):
    logits, loss = output
    targets = args[2] if len(args) > 2 else kwargs.get("targets")
    return (logits, loss) if targets is not None else (logits[:, [-1], :], loss)


def _vision_returns(module, args, kwargs, output):
    return output[0]


# reference class -> how its port returns what it returns: "returns" (the module's attribute)
# or a forward hook adapting our return value (module-level functions: ported models pickle)
REFERENCE_RETURNS: dict[str, str | Callable] = {
    "Attention": _attention_returns,
    "RelationalAttention": "returns",
    "DualAttention": "returns",
    "PositionRelativeSymbolRetriever": "returns",
    "Seq2SeqTransformer": _seq2seq_returns,
    "Seq2SeqDualAttnTransformer": _seq2seq_returns,
    "VisionTransformer": _vision_returns,
    "VisionDualAttnTransformer": _vision_returns,
}


def port(module: nn.Module, backend: str = "auto", returns: str = "output") -> nn.Module:
    """Our module equivalent to the reference `module`, with its weights, dtype, device and
    train/eval mode. `backend` sets the attention backend of the ported mechanisms.
    `returns`: "output" (our convention: attention modules return their output) or
    "reference" (whatever the reference module returns, e.g. RelationalAttention's
    (output, attention scores, relations); see the module docstring)."""
    check_returns(returns)
    name = type(module).__name__
    if not type(module).__module__.startswith("dual_attention") or name not in PORTERS:
        raise unknown_name_error(f"dual_attention class ({type(module).__module__})", name, PORTERS)
    ours = PORTERS[name](module)
    reference = next(iter(module.state_dict().values()))
    ours.to(dtype=reference.dtype, device=reference.device)
    ours.load_state_dict(convert_state_dict(module.state_dict(), like=ours))
    if isinstance(ours, AttentionMechanism):
        ours.backend = backend
    adapt = REFERENCE_RETURNS.get(name.removesuffix("_HFHub"))
    if returns == "reference" and adapt == "returns":
        ours.returns = returns
    elif returns == "reference" and adapt is not None:
        ours.register_forward_hook(adapt, with_kwargs=True)
    return ours.train(module.training)
