"""Ported reference blocks and models give the `dual-attention` package's logits and loss,
float64, to 1e-10 (eval mode); checkpoints convert in the shapes they come in."""

import pytest
import torch
from dual_attention import (
    dual_attn_blocks,
    language_models,
    seq2seq_models,
    transformer_blocks,
    vision_models,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_zoo.interop.dual_attention import convert_state_dict, port
from attn_zoo.interop.dual_attention_models import DualAttnTransformerLM as OurDualLM

ATOL = 1e-10
RETRIEVERS = {
    "symbolic_attention": lambda d: dict(d_model=d, n_heads=2, n_symbols=6),
    "positional_symbols": lambda d: dict(symbol_dim=d, max_length=16),
    "position_relative": lambda d: dict(symbol_dim=d, max_rel_pos=3),
}


def assert_same(ours, ref):
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


@settings(max_examples=12)
@given(
    st.sampled_from(sorted(RETRIEVERS)),
    st.sampled_from(["pos_emb", "RoPE"]),
    st.booleans(),
    st.sampled_from(["layernorm", "rmsnorm"]),
    st.sampled_from(["relu", "gelu", "swiglu"]),
    st.booleans(),
    st.integers(0, 999),
)
def test_dual_attention_lm(retrieval, pos_enc, norm_first, norm_type, activation, shared, seed):
    torch.manual_seed(seed)
    d = 16
    ra_kwargs = dict(
        n_relations=4,
        rel_activation="tanh",
        use_relative_positional_symbols=retrieval == "position_relative",
    )
    ref = (
        language_models.DualAttnTransformerLM(
            vocab_size=11,
            d_model=d,
            n_layers=2,
            n_heads_sa=2,
            n_heads_ra=2,
            symbol_retrieval_kwargs=RETRIEVERS[retrieval](d),
            dff=None,
            dropout_rate=0.0,
            activation=activation,
            norm_first=norm_first,
            max_block_size=16,
            norm_type=norm_type,
            sa_kwargs=dict(n_kv_heads=1),
            ra_kwargs=ra_kwargs,
            symbol_retrieval=retrieval,
            symbol_retriever_config=dict(
                shared_symbol_retriever=shared or retrieval == "position_relative"
            ),
            pos_enc_type=pos_enc,
        )
        .double()
        .eval()
    )
    ours = port(ref)
    idx = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(seed))
    ref_logits, ref_loss = ref(idx, idx)
    for backend in ("naive", "chunked", "fused"):
        ours_logits, ours_loss = port(ref, backend=backend)(idx, idx)
        assert_same(ours_logits, ref_logits)
        assert_same(ours_loss, ref_loss)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("pos_enc", ["pos_emb", "RoPE"])
def test_transformer_lm(pos_enc):
    torch.manual_seed(0)
    ref = (
        language_models.TransformerLM(
            vocab_size=13,
            d_model=16,
            n_layers=2,
            n_heads=4,
            dff=24,
            dropout_rate=0.0,
            activation="gelu",
            norm_first=True,
            max_block_size=12,
            pos_enc_type=pos_enc,
            block_kwargs=dict(attn_kwargs=dict(n_kv_heads=2)),
        )
        .double()
        .eval()
    )
    idx = torch.randint(0, 13, (2, 12))
    for got, want in zip(port(ref)(idx, idx), ref(idx, idx), strict=True):
        assert_same(got, want)


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_seq2seq(dual, norm_first):
    torch.manual_seed(1)
    common = dict(dff=20, dropout_rate=0.0, activation="relu", norm_first=norm_first)
    if dual:
        enc = dict(n_heads_sa=1, n_heads_ra=1, ra_kwargs=dict(symmetric_rels=True), **common)
        dec = dict(n_heads_sa=1, n_heads_ra=1, n_heads_cross=2, **common)
        ref = seq2seq_models.Seq2SeqDualAttnTransformer(
            dict(type="token", vocab_size=9),
            dict(type="token", vocab_size=7),
            "symbolic_attention",
            dict(d_model=8, n_heads=2, n_symbols=4),
            d_model=8,
            out_dim=7,
            n_layers_enc=2,
            n_layers_dec=3,
            encoder_kwargs=enc,
            decoder_kwargs=dec,
            in_block_size=10,
            out_block_size=10,
        )
    else:
        enc = dict(n_heads=2, **common)
        dec = dict(n_heads=2, n_heads_cross=4, causal=True, **common)
        ref = seq2seq_models.Seq2SeqTransformer(
            dict(type="token", vocab_size=9),
            dict(type="token", vocab_size=7),
            d_model=8,
            out_dim=7,
            n_layers_enc=2,
            n_layers_dec=1,
            encoder_kwargs=enc,
            decoder_kwargs=dec,
            in_block_size=10,
            out_block_size=10,
        )
    ref = ref.double().eval()
    ours = port(ref)
    src, tgt = torch.randint(0, 9, (2, 10)), torch.randint(0, 7, (2, 6))
    for got, want in zip(ours(src, tgt, tgt), ref(src, tgt, tgt), strict=True):
        assert_same(got, want)
    assert len(ours.decoder_blocks) == (2 if dual else 1)  # reference: n_layers_enc decoder blocks
    assert_same(ours(src, tgt)[0][:, [-1]], ref(src, tgt)[0])  # reference: last position only


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vision(dual, pool):
    torch.manual_seed(2)
    common = dict(
        image_shape=(3, 12, 8),
        patch_size=(4, 2),
        num_classes=5,
        d_model=8,
        n_layers=2,
        dff=16,
        dropout_rate=0.0,
        activation="gelu",
        norm_first=True,
        pool=pool,
    )
    if dual:
        ref = vision_models.VisionDualAttnTransformer(
            n_heads_sa=1,
            n_heads_ra=1,
            symbol_retrieval="positional_symbols",
            symbol_retrieval_kwargs=dict(symbol_dim=8, max_length=20),
            **common,
        )
    else:
        ref = vision_models.VisionTransformer(n_heads=2, **common)
    ref = ref.double().eval()
    images = torch.randn(2, 3, 8, 12, dtype=torch.float64)  # (B, C, height, width)
    assert_same(port(ref)(images)[0], ref(images))


@pytest.mark.parametrize(
    "make",
    [
        lambda: transformer_blocks.EncoderBlock(8, 2, 16, 0.0, "relu", False, causal=True),
        lambda: dual_attn_blocks.DualAttnEncoderBlock(
            8, 1, 1, 16, "silu", 0.0, True, norm_type="rmsnorm"
        ),
    ],
)
def test_encoder_blocks(make):
    torch.manual_seed(3)
    ref = make().double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    symbols = torch.randn(2, 5, 8, dtype=torch.float64)
    if isinstance(ref, dual_attn_blocks.DualAttnEncoderBlock):
        assert_same(port(ref)(x, symbols), ref(x, symbols))
    else:
        assert_same(port(ref)(x), ref(x))


def test_decoder_blocks():
    torch.manual_seed(4)
    x, ctx, s = (torch.randn(2, 5, 8, dtype=torch.float64) for _ in range(3))
    ref = (
        transformer_blocks.DecoderBlock(8, 2, 4, 16, 0.0, "relu", True, causal=True).double().eval()
    )
    assert_same(port(ref)(x, context=ctx), ref(x, ctx))
    ref = dual_attn_blocks.DualAttnDecoderBlock(8, 1, 1, 2, 16, "relu", 0.0, False).double().eval()
    assert_same(port(ref)(x, s, context=ctx), ref(x, ctx, s))


def small_dual_lm_kwargs(shared: bool) -> dict:
    return dict(
        vocab_size=11,
        d_model=8,
        n_layers=3,
        n_heads_sa=1,
        n_heads_ra=1,
        symbol_retrieval_kwargs=dict(d_model=8, n_heads=2, n_symbols=4),
        dff=16,
        dropout_rate=0.0,
        activation="relu",
        norm_first=True,
        max_block_size=8,
        symbol_retriever_config=dict(shared_symbol_retriever=shared),
    )


@pytest.mark.parametrize("shared", [True, False])
def test_checkpoints_in_every_shape(shared, tmp_path):
    """The same kwargs build the reference and ours; its checkpoints load into ours."""
    torch.manual_seed(5)
    ref = language_models.DualAttnTransformerLM(**small_dual_lm_kwargs(shared)).double().eval()
    idx = torch.randint(0, 11, (2, 8))
    want = ref(idx)[0]
    kwargs = small_dual_lm_kwargs(shared)
    torch.save({f"_orig_mod.{k}": v for k, v in ref.state_dict().items()}, tmp_path / "ckpt.pt")
    compiled = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    deduplicated = {
        k: v for k, v in ref.state_dict().items() if k != "layers.token_embedder.weight"
    }
    if shared:  # safetensors keeps one copy of a shared tensor
        deduplicated = {
            k: v
            for k, v in deduplicated.items()
            if not k.startswith("layers.symbol_retrievers.")
            or k.startswith("layers.symbol_retrievers.0.")
        }
    for state in (compiled, deduplicated):
        ours = OurDualLM(**kwargs).double().eval()
        ours.load_state_dict(convert_state_dict(state))  # no `like`: inferred from the checkpoint
        assert_same(ours(idx)[0], want)


PER_LAYER_INTO_SHARED = (
    "one symbol retriever per layer .*symbol_retrievers.1.* != symbol_retrievers.0.* "
    "but the model shares one retriever across layers.*shared_symbol_retriever=False"
)
SHARED_INTO_PER_LAYER = (
    "one symbol retriever shared by every layer .*symbol_retrievers.0.* but the model has one "
    "per layer .3 retrievers.*shared_symbol_retriever=True"
)


def test_per_layer_retrievers_do_not_load_into_a_shared_one():
    """A per-layer checkpoint into a shared retriever used to load silently (the last layer's
    values won, logits off by ~3e-3); now a ValueError names the differing keys."""
    torch.manual_seed(7)
    ref = language_models.DualAttnTransformerLM(**small_dual_lm_kwargs(False)).double()
    ours = OurDualLM(**small_dual_lm_kwargs(True)).double()
    with pytest.raises(ValueError, match=PER_LAYER_INTO_SHARED):
        convert_state_dict(ref.state_dict(), like=ours)
    # the matching model loads it, and a shared checkpoint loads into a shared model
    matching = OurDualLM(**small_dual_lm_kwargs(False)).double()
    matching.load_state_dict(convert_state_dict(ref.state_dict(), like=matching))
    shared_ref = language_models.DualAttnTransformerLM(**small_dual_lm_kwargs(True)).double()
    ours.load_state_dict(convert_state_dict(shared_ref.state_dict(), like=ours))
    idx = torch.randint(0, 11, (2, 8))
    assert_same(matching.eval()(idx)[0], ref.eval()(idx)[0])
    assert_same(ours.eval()(idx)[0], shared_ref.eval()(idx)[0])


def test_a_shared_retriever_does_not_load_into_per_layer_ones():
    """The other direction: a shared checkpoint, whole (one tensor listed per layer) or
    stored once (layer 0 only, as safetensors writes it), into per-layer retrievers."""
    torch.manual_seed(8)
    ref = language_models.DualAttnTransformerLM(**small_dual_lm_kwargs(True)).double()
    ours = OurDualLM(**small_dual_lm_kwargs(False)).double()
    whole = ref.state_dict()
    once = {
        k: v
        for k, v in whole.items()
        if "symbol_retrievers." not in k or "symbol_retrievers.0." in k
    }
    for state in (whole, once):
        with pytest.raises(ValueError, match=SHARED_INTO_PER_LAYER):
            convert_state_dict(state, like=ours)


@pytest.mark.parametrize(
    "key",
    [
        "layers.symbol_retrievers.x.q_proj.weight",
        "layers.symbol_retrievers.0.",
        "layers.symbol_retrievers..q_proj.weight",
        "symbol_retrievers.-1.q_proj.weight",
    ],
)
@pytest.mark.parametrize("shared", [True, False])
def test_a_malformed_retriever_key_is_named(key, shared):
    """Crafted retriever keys raised AttributeError ('NoneType' has no 'groups'); now a
    ValueError naming the key and the expected form, with and without `like`."""
    ref = language_models.DualAttnTransformerLM(**small_dual_lm_kwargs(shared))
    state = {**ref.state_dict(), key: torch.zeros(2)}
    ours = OurDualLM(**small_dual_lm_kwargs(shared))
    renamed = key.removeprefix("layers.")
    for like in (ours, None):
        with pytest.raises(ValueError, match=f"'{renamed}'.*'symbol_retrievers.<layer>.<param"):
            convert_state_dict(state, like=like)


def test_reference_returns_of_models_and_blocks():
    """port(..., returns="reference"): Seq2Seq without targets returns only the last
    position's logits and the vision models the logits alone, as the reference; language
    models and blocks return what the reference returns either way."""
    torch.manual_seed(6)
    common = dict(dff=16, dropout_rate=0.0, activation="relu", norm_first=True)
    seq2seq = seq2seq_models.Seq2SeqDualAttnTransformer(
        dict(type="token", vocab_size=9),
        dict(type="token", vocab_size=7),
        "position_relative",
        dict(symbol_dim=8, max_rel_pos=2),
        d_model=8,
        out_dim=7,
        n_layers_enc=1,
        n_layers_dec=1,
        encoder_kwargs=dict(
            n_heads_sa=1, n_heads_ra=1, ra_kwargs=dict(use_relative_positional_symbols=True),
            **common,
        ),
        decoder_kwargs=dict(
            n_heads_sa=1, n_heads_ra=1, n_heads_cross=2,
            ra_kwargs=dict(use_relative_positional_symbols=True), **common,
        ),
        in_block_size=10,
        out_block_size=10,
    ).double().eval()  # fmt: skip
    src, tgt = torch.randint(0, 9, (2, 10)), torch.randint(0, 7, (2, 6))
    ours = port(seq2seq, returns="reference")
    for call in ((src, tgt), (src, tgt, tgt)):
        (got, got_loss), (want, want_loss) = ours(*call), seq2seq(*call)
        assert got.shape == want.shape
        assert_same(got, want)
        assert (got_loss is None) == (want_loss is None)
    assert ours(src, tgt, targets=None)[0].shape == (2, 1, 7)

    vit = vision_models.VisionTransformer(
        image_shape=(3, 8, 8), patch_size=(4, 4), num_classes=5, d_model=8, n_layers=1,
        n_heads=2, **common,
    ).double().eval()  # fmt: skip
    images = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    logits = port(vit, returns="reference")(images)
    assert torch.is_tensor(logits)
    assert_same(logits, vit(images))

    lm = language_models.DualAttnTransformerLM(**small_dual_lm_kwargs(True)).double().eval()
    idx = torch.randint(0, 11, (2, 8))
    for got, want in zip(port(lm, returns="reference")(idx, idx), lm(idx, idx), strict=True):
        assert_same(got, want)
    block = dual_attn_blocks.DualAttnEncoderBlock(8, 1, 1, 16, "relu", 0.0, True).double().eval()
    x, s = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    assert_same(port(block, returns="reference")(x, s), block(x, s))
