"""The `dual-attention` reference's block and model constructors, building ours.

Each function takes the reference class's arguments (same names, order and defaults) and
returns the equivalent attn_zoo module, so a reader of the paper's code builds the same model
here; `attn_zoo.interop.dual_attention.port` uses them with a reference module's settings.
Where the reference has a bug that changes outputs, these reproduce it (marked "reference:"):
- DualAttnTransformerLM ignores its `bias` (FFN biases always on);
- DecoderBlock's cross-attention uses n_heads, not n_heads_cross; decoder blocks are
  non-causal unless causal=True;
- Seq2SeqDualAttnTransformer builds n_layers_enc decoder blocks (n_layers_dec is ignored);
- the Seq2Seq models have no final norm and the vision models neither.
Dropout placement in training differs slightly (here dropout follows every sub-layer); eval
outputs are the same.
"""

from __future__ import annotations

from attn_zoo.models import LanguageModel, Seq2Seq, VisionClassifier
from attn_zoo.models.block import Block

WIDTH_KWARGS = ("d_model", "symbol_dim")
NOT_PORTED = "is not available in attn_zoo"


def _retriever_kwargs(name: str, kwargs: dict | None, d_model: int) -> dict:
    """The reference passes the symbol width explicitly; ours takes it from d_model."""
    if name == "rel_sym_attn":
        raise ValueError(f"symbol_retrieval='rel_sym_attn' {NOT_PORTED}")
    kwargs = dict(kwargs or {})
    for key in WIDTH_KWARGS:
        if key in kwargs and kwargs.pop(key) != d_model:
            raise ValueError(f"symbol_retrieval_kwargs[{key!r}] must equal d_model={d_model}")
    return kwargs


def _dual(n_heads_sa, n_heads_ra, sa_kwargs, ra_kwargs, ra_type, share_attn_params) -> dict:
    return dict(
        n_heads_sa=n_heads_sa,
        n_heads_ra=n_heads_ra,
        sa_kwargs=sa_kwargs,
        ra_kwargs=ra_kwargs,
        ra_type=ra_type,
        share_attn_params=share_attn_params,
    )


def EncoderBlock(
    d_model,
    n_heads,
    dff,
    dropout_rate,
    activation,
    norm_first,
    norm_type="layernorm",
    bias=True,
    causal=False,
    attn_kwargs=None,
) -> Block:
    attention = dict(n_heads=n_heads, add_bias_out=bias, **(attn_kwargs or {}))
    return Block(
        d_model=d_model,
        attention="standard",
        attention_kwargs=attention,
        dff=dff,
        activation=activation,
        dropout=dropout_rate,
        norm_first=norm_first,
        norm_type=norm_type,
        causal=causal,
        cross_attention=None,
        bias=bias,
    )


def DecoderBlock(
    d_model,
    n_heads,
    n_heads_cross,
    dff,
    dropout_rate,
    activation,
    norm_first,
    norm_type="layernorm",
    bias=True,
    causal=False,
) -> Block:
    attention = dict(n_heads=n_heads, add_bias_out=bias)
    cross = dict(n_heads=n_heads, add_bias_out=bias)  # reference: n_heads_cross is ignored
    return Block(
        d_model=d_model,
        attention="standard",
        attention_kwargs=attention,
        dff=dff,
        activation=activation,
        dropout=dropout_rate,
        norm_first=norm_first,
        norm_type=norm_type,
        causal=causal,
        cross_attention=cross,
        bias=bias,
    )


def DualAttnEncoderBlock(
    d_model,
    n_heads_sa,
    n_heads_ra,
    dff,
    activation,
    dropout_rate,
    norm_first,
    norm_type="layernorm",
    sa_kwargs=None,
    ra_kwargs=None,
    ra_type="relational_attention",
    share_attn_params=False,
    bias=True,
    causal=False,
) -> Block:
    attention = _dual(n_heads_sa, n_heads_ra, sa_kwargs, ra_kwargs, ra_type, share_attn_params)
    return Block(
        d_model=d_model,
        attention="dual",
        attention_kwargs=attention,
        dff=dff,
        activation=activation,
        dropout=dropout_rate,
        norm_first=norm_first,
        norm_type=norm_type,
        causal=causal,
        cross_attention=None,
        bias=bias,
    )


def DualAttnDecoderBlock(
    d_model,
    n_heads_sa,
    n_heads_ra,
    n_heads_cross,
    dff,
    activation,
    dropout_rate,
    norm_first,
    norm_type="layernorm",
    sa_kwargs=None,
    ra_kwargs=None,
    cross_kwargs=None,
    ra_type="relational_attention",
    share_attn_params=False,
    bias=True,
    causal=True,
) -> Block:
    attention = _dual(n_heads_sa, n_heads_ra, sa_kwargs, ra_kwargs, ra_type, share_attn_params)
    cross = dict(n_heads=n_heads_cross, **(cross_kwargs or {}))
    return Block(
        d_model=d_model,
        attention="dual",
        attention_kwargs=attention,
        dff=dff,
        activation=activation,
        dropout=dropout_rate,
        norm_first=norm_first,
        norm_type=norm_type,
        causal=causal,
        cross_attention=cross,
        bias=bias,
    )


def _pos_enc(pos_enc_type: str) -> str:
    if pos_enc_type not in ("pos_emb", "RoPE"):
        raise ValueError(f"pos_enc_type={pos_enc_type!r}: valid are 'pos_emb', 'RoPE'")
    return "learned" if pos_enc_type == "pos_emb" else "rope"


def TransformerLM(
    vocab_size,
    d_model,
    n_layers,
    n_heads,
    dff,
    dropout_rate,
    activation,
    norm_first,
    max_block_size,
    norm_type="layernorm",
    bias=True,
    pos_enc_type="pos_emb",
    use_flash_attention=True,
    block_kwargs=None,
) -> LanguageModel:
    """use_flash_attention only chose the reference's attention code path; the math is one."""
    block_kwargs = dict(block_kwargs or {})
    attention = dict(
        n_heads=n_heads, add_bias_out=bias, **block_kwargs.pop("attn_kwargs", None) or {}
    )
    if block_kwargs:
        raise ValueError(f"block_kwargs keys {sorted(block_kwargs)}: only 'attn_kwargs' is ported")
    return LanguageModel(
        vocab_size,
        d_model=d_model,
        n_layers=n_layers,
        attention="standard",
        attention_kwargs=attention,
        dff=dff,
        activation=activation,
        dropout=dropout_rate,
        norm_first=norm_first,
        norm_type=norm_type,
        max_block_size=max_block_size,
        pos_enc=_pos_enc(pos_enc_type),
        bias=bias,
    )


def DualAttnTransformerLM(
    vocab_size,
    d_model,
    n_layers,
    n_heads_sa,
    n_heads_ra,
    symbol_retrieval_kwargs,
    dff,
    dropout_rate,
    activation,
    norm_first,
    max_block_size,
    norm_type="layernorm",
    sa_kwargs=None,
    ra_kwargs=None,
    ra_type="relational_attention",
    share_attn_params=False,
    symbol_retrieval="symbolic_attention",
    symbol_retriever_config=None,
    pos_enc_type="pos_emb",
    bias=True,
) -> LanguageModel:
    config = {"shared_symbol_retriever": True, "weight_tie_symbol_library": False}
    config.update(symbol_retriever_config or {})
    attention = _dual(n_heads_sa, n_heads_ra, sa_kwargs, ra_kwargs, ra_type, share_attn_params)
    model = LanguageModel(
        vocab_size,
        d_model=d_model,
        n_layers=n_layers,
        attention="dual",
        attention_kwargs=attention,
        dff=dff,
        activation=activation,
        dropout=dropout_rate,
        norm_first=norm_first,
        norm_type=norm_type,
        max_block_size=max_block_size,
        pos_enc=_pos_enc(pos_enc_type),
        bias=True,  # reference: the LM's bias is not passed on
        symbol_retrieval=symbol_retrieval,
        symbol_retrieval_kwargs=_retriever_kwargs(
            symbol_retrieval, symbol_retrieval_kwargs, d_model
        ),
        shared_symbol_retriever=config["shared_symbol_retriever"],
    )
    if config["weight_tie_symbol_library"] and not config["shared_symbol_retriever"]:
        first = model.symbol_retriever[0]
        if not hasattr(first, "symbol_library"):
            raise ValueError(
                f"weight_tie_symbol_library needs a library; {symbol_retrieval} has none"
            )
        for retriever in model.symbol_retriever[1:]:
            retriever.symbol_library = first.symbol_library
    return model


def _token_vocab(spec: dict, name: str) -> int:
    if spec.get("type") != "token":
        raise ValueError(
            f"{name}={spec}: only {{'type': 'token', 'vocab_size': V}} {NOT_PORTED[3:]}"
        )
    return spec["vocab_size"]


def _seq2seq_block(kwargs: dict, cross: bool, dual: bool) -> tuple[str, dict, dict, dict | None]:
    """(attention, attention kwargs, Block kwargs, cross kwargs) from reference block kwargs."""
    kw = dict(kwargs)
    block = {
        "dff": kw.pop("dff", None),
        "activation": kw.pop("activation"),
        "dropout": kw.pop("dropout_rate"),
        "norm_first": kw.pop("norm_first"),
        "norm_type": kw.pop("norm_type", "layernorm"),
        "bias": kw.pop("bias", True),
        "causal": kw.pop("causal", dual and cross),
    }
    if dual:
        attention = _dual(
            kw.pop("n_heads_sa"),
            kw.pop("n_heads_ra"),
            kw.pop("sa_kwargs", None),
            kw.pop("ra_kwargs", None),
            kw.pop("ra_type", "relational_attention"),
            kw.pop("share_attn_params", False),
        )
        cross_kwargs = None
        if cross:
            cross_kwargs = dict(
                n_heads=kw.pop("n_heads_cross"), **(kw.pop("cross_kwargs", None) or {})
            )
    else:
        n_heads = kw.pop("n_heads")
        attention = dict(
            n_heads=n_heads, add_bias_out=block["bias"], **(kw.pop("attn_kwargs", None) or {})
        )
        kw.pop("n_heads_cross", None)  # reference: ignored, cross-attention uses n_heads
        cross_kwargs = dict(n_heads=n_heads, add_bias_out=block["bias"])
    if kw:
        raise ValueError(f"unexpected block kwargs {sorted(kw)}")
    return ("dual" if dual else "standard"), attention, block, (cross_kwargs if cross else None)


def _seq2seq(
    input_spec,
    output_spec,
    d_model,
    out_dim,
    n_enc,
    n_dec,
    encoder_kwargs,
    decoder_kwargs,
    in_block_size,
    out_block_size,
    loss_ignore_idx,
    dual,
    symbol_retrieval=None,
    symbol_retrieval_kwargs=None,
) -> Seq2Seq:
    enc_attn, enc_kwargs, enc_block, _ = _seq2seq_block(encoder_kwargs, False, dual)
    dec_attn, dec_kwargs, dec_block, cross = _seq2seq_block(decoder_kwargs, True, dual)
    retriever = {}
    if dual:
        kwargs = _retriever_kwargs(symbol_retrieval, symbol_retrieval_kwargs, d_model)
        retriever = dict(symbol_retrieval=symbol_retrieval, symbol_retrieval_kwargs=kwargs)
    return Seq2Seq(
        _token_vocab(input_spec, "input_spec"),
        _token_vocab(output_spec, "output_spec"),
        d_model=d_model,
        n_layers_enc=n_enc,
        n_layers_dec=n_dec,
        encoder_attention=enc_attn,
        encoder_attention_kwargs=enc_kwargs,
        decoder_attention=dec_attn,
        decoder_attention_kwargs=dec_kwargs,
        cross_attention_kwargs=cross,
        in_block_size=in_block_size,
        out_block_size=out_block_size,
        pos_enc="sinusoidal",
        scale_embeddings=True,
        final_norm=False,
        out_bias=True,
        loss_ignore_idx=loss_ignore_idx,
        out_dim=out_dim,
        encoder_block_kwargs=enc_block,
        decoder_block_kwargs=dec_block,
        **retriever,
    )


def Seq2SeqTransformer(
    input_spec,
    output_spec,
    d_model,
    out_dim,
    n_layers_enc,
    n_layers_dec,
    encoder_kwargs,
    decoder_kwargs,
    in_block_size,
    out_block_size,
    tie_weights=True,
    loss_ignore_idx=-1,
) -> Seq2Seq:
    """tie_weights tied nothing in the reference (it registered an alias submodule)."""
    return _seq2seq(
        input_spec,
        output_spec,
        d_model,
        out_dim,
        n_layers_enc,
        n_layers_dec,
        encoder_kwargs,
        decoder_kwargs,
        in_block_size,
        out_block_size,
        loss_ignore_idx,
        dual=False,
    )


def Seq2SeqDualAttnTransformer(
    input_spec,
    output_spec,
    symbol_retrieval,
    symbol_retrieval_kwargs,
    d_model,
    out_dim,
    n_layers_enc,
    n_layers_dec,
    encoder_kwargs,
    decoder_kwargs,
    in_block_size,
    out_block_size,
    tie_weights=True,
    loss_ignore_idx=-1,
) -> Seq2Seq:
    # reference: the decoder is built with n_layers_enc blocks
    return _seq2seq(
        input_spec,
        output_spec,
        d_model,
        out_dim,
        n_layers_enc,
        n_layers_enc,
        encoder_kwargs,
        decoder_kwargs,
        in_block_size,
        out_block_size,
        loss_ignore_idx,
        True,
        symbol_retrieval,
        symbol_retrieval_kwargs,
    )


def _vision_shape(image_shape, patch_size) -> tuple[tuple, tuple]:
    """The reference reads image_shape as (C, width, height), patch_size as (width, height)."""
    channels, width, height = image_shape
    patch_width, patch_height = patch_size
    return (channels, height, width), (patch_height, patch_width)


def VisionTransformer(
    image_shape,
    patch_size,
    num_classes,
    d_model,
    n_layers,
    n_heads,
    dff,
    dropout_rate,
    activation,
    norm_first,
    norm_type="layernorm",
    bias=True,
    pool="cls",
) -> VisionClassifier:
    shape, patch = _vision_shape(image_shape, patch_size)
    return VisionClassifier(
        shape,
        patch,
        num_classes,
        d_model=d_model,
        n_layers=n_layers,
        attention="standard",
        attention_kwargs=dict(n_heads=n_heads, add_bias_out=bias),
        dff=dff,
        activation=activation,
        dropout=dropout_rate,
        norm_first=norm_first,
        norm_type=norm_type,
        pool=pool,
        final_norm=False,
        bias=bias,
    )


def VisionDualAttnTransformer(
    image_shape,
    patch_size,
    num_classes,
    d_model,
    n_layers,
    n_heads_sa,
    n_heads_ra,
    dff,
    dropout_rate,
    activation,
    norm_first,
    symbol_retrieval,
    symbol_retrieval_kwargs,
    ra_type="relational_attention",
    ra_kwargs=None,
    sa_kwargs=None,
    norm_type="layernorm",
    bias=True,
    pool="cls",
) -> VisionClassifier:
    shape, patch = _vision_shape(image_shape, patch_size)
    return VisionClassifier(
        shape,
        patch,
        num_classes,
        d_model=d_model,
        n_layers=n_layers,
        attention="dual",
        attention_kwargs=_dual(n_heads_sa, n_heads_ra, sa_kwargs, ra_kwargs, ra_type, False),
        dff=dff,
        activation=activation,
        dropout=dropout_rate,
        norm_first=norm_first,
        norm_type=norm_type,
        pool=pool,
        final_norm=False,
        bias=bias,
        symbol_retrieval=symbol_retrieval,
        symbol_retrieval_kwargs=_retriever_kwargs(
            symbol_retrieval, symbol_retrieval_kwargs, d_model
        ),
    )
