"""The block and the model family with every registered mechanism: training, round trips,
torch.compile, clear errors."""

import pytest
import torch

import attn_zoo as az
from attn_zoo.kernels.rotary import Rotary, rotary_tables
from attn_zoo.models import LanguageModel, Seq2Seq, VisionClassifier
from attn_zoo.models.block import Block
from attn_zoo.models.positional import POSITIONAL, build_positional

D = 16
SYMBOLS = dict(
    symbol_retrieval="symbolic_attention", symbol_retrieval_kwargs=dict(n_symbols=4, n_heads=2)
)
MECHANISMS = {  # name -> (attention kwargs, model kwargs, LM positions); every name must be here
    "standard": (dict(n_heads=2), {}, "rope"),
    "relational": (dict(n_heads=2, n_relations=3), SYMBOLS, "rope"),
    "dual": (dict(n_heads_sa=1, n_heads_ra=1), SYMBOLS, "rope"),
    "axial": (dict(n_heads=2, n_axes=1), {}, "learned"),  # one axis: the sequence
    "additive": (dict(n_heads=2), {}, "learned"),  # no RoPE: no query-key products
    "linear": (dict(n_heads=2), {}, "learned"),  # RoPE is refused with a clear error
    "differential": (dict(n_heads=2), {}, "rope"),
    "sigmoid": (dict(n_heads=2), {}, "rope"),
    "softcapped": (dict(n_heads=2, cap=5.0), {}, "rope"),
    "gla": (dict(n_heads=2), {}, "learned"),  # causal only: see CAUSAL_ONLY
}
CAUSAL_ONLY = {"gla"}  # refused by non-causal blocks (encoders, classifiers) with a clear error
NOT_SEQUENCE = {  # mechanisms whose inputs are not token sequences, with the reason
    "msa_row": "(B, rows, cols, D) multiple sequence alignments",
    "msa_column": "(B, rows, cols, D) multiple sequence alignments",
}


def test_every_registered_mechanism_is_covered():
    assert set(az.list_mechanisms()) == set(MECHANISMS) | set(NOT_SEQUENCE), az.list_mechanisms()


def train(model, batch, steps=15):
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        _, loss = model(*batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert min(losses[-3:]) < losses[0], losses
    return losses


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_language_model_trains_and_round_trips(mechanism, tmp_path):
    attention, extra, pos_enc = MECHANISMS[mechanism]
    torch.manual_seed(0)
    model = LanguageModel(
        20,
        D,
        2,
        attention=mechanism,
        attention_kwargs=attention,
        max_block_size=12,
        pos_enc=pos_enc,
        **extra,
    )
    idx = torch.randint(0, 20, (4, 12), generator=torch.Generator().manual_seed(0))
    train(model, (idx[:, :-1], idx[:, 1:]))
    torch.save(model.state_dict(), tmp_path / "lm.pt")
    again = LanguageModel(
        20,
        D,
        2,
        attention=mechanism,
        attention_kwargs=attention,
        max_block_size=12,
        pos_enc=pos_enc,
        **extra,
    )
    again.load_state_dict(torch.load(tmp_path / "lm.pt", weights_only=True))
    model.eval(), again.eval()
    torch.testing.assert_close(again(idx)[0], model(idx)[0])
    assert model.generate(idx[:, :3], 5, temperature=0.8, top_k=4).shape == (4, 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_language_model_trains_under_autocast(mechanism, dtype):
    """Under autocast (a grid's precision = "bf16") the projections give half-precision q, k, v
    while a mechanism's own parameters stay float32: every mechanism takes that mix, and its
    loss and every gradient are finite and near the float32 ones."""
    attention, extra, pos_enc = MECHANISMS[mechanism]
    torch.manual_seed(0)
    model = LanguageModel(
        20, D, 2, attention=mechanism, attention_kwargs=attention, max_block_size=12,
        pos_enc=pos_enc, **extra,
    )  # fmt: skip
    idx = torch.randint(0, 20, (4, 12), generator=torch.Generator().manual_seed(0))
    _, exact = model(idx[:, :-1], idx[:, 1:])
    with torch.autocast("cpu", dtype=dtype):
        _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert loss.dtype == torch.float32 and abs(loss.item() - exact.item()) < 0.05
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_seq2seq_trains(mechanism):
    attention, extra, _ = MECHANISMS[mechanism]
    encoder, encoder_kwargs = (
        ("standard", dict(n_heads=2)) if mechanism in CAUSAL_ONLY else (mechanism, attention)
    )  # a causal-only mechanism in the (causal) decoder only
    torch.manual_seed(0)
    model = Seq2Seq(
        10,
        12,
        D,
        1,
        1,
        encoder_attention=encoder,
        encoder_attention_kwargs=encoder_kwargs,
        decoder_attention=mechanism,
        decoder_attention_kwargs=attention,
        cross_attention_kwargs=dict(n_heads=2),
        **extra,
    )
    src = torch.randint(0, 10, (4, 7), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(0, 12, (4, 6), generator=torch.Generator().manual_seed(2))
    train(model, (src, tgt[:, :-1], tgt[:, 1:]))
    assert model.greedy_decode(src, 0, 4).shape == (4, 5)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vision_classifier_trains(mechanism, pool):
    attention, extra, _ = MECHANISMS[mechanism]
    torch.manual_seed(0)
    model = VisionClassifier(
        (3, 8, 8), 4, 3, D, 1, attention=mechanism, attention_kwargs=attention, pool=pool, **extra
    )
    images = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    if mechanism in CAUSAL_ONLY:
        with pytest.raises(ValueError, match="causal only"):
            model(images)
        return
    train(model, (images, torch.arange(6) % 3))


def test_language_model_is_causal_and_backends_agree():
    torch.manual_seed(0)
    model = LanguageModel(
        20,
        D,
        2,
        attention="dual",
        attention_kwargs=dict(n_heads_sa=1, n_heads_ra=1),
        max_block_size=12,
        **SYMBOLS,
    ).eval()
    idx = torch.randint(0, 20, (2, 10))
    changed = idx.clone()
    changed[:, 7:] = (idx[:, 7:] + 1) % 20
    torch.testing.assert_close(model(idx)[0][:, :7], model(changed)[0][:, :7])
    reference = model(idx)[0]
    for backend in ("naive", "chunked", "fused"):
        az.set_backend(model, backend)
        torch.testing.assert_close(model(idx)[0], reference, atol=1e-5, rtol=1e-4)


def test_per_layer_retrievers_and_untied_embeddings():
    model = LanguageModel(
        20,
        D,
        3,
        attention="relational",
        attention_kwargs=dict(n_heads=2),
        shared_symbol_retriever=False,
        tie_weights=False,
        **SYMBOLS,
    )
    assert len(model.symbol_retriever) == 3
    assert model.token_embedder.weight is not model.final_out.weight
    shared = LanguageModel(
        20, D, 3, attention="relational", attention_kwargs=dict(n_heads=2), **SYMBOLS
    )
    assert shared.token_embedder.weight is shared.final_out.weight


def retrieval_model(model: str, shared: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    settings = dict(attention="dual", attention_kwargs=dict(n_heads_sa=1, n_heads_ra=1))
    settings |= dict(shared_symbol_retriever=shared, **SYMBOLS)
    if model == "language_model":
        return LanguageModel(20, D, 3, **settings)
    return VisionClassifier((1, 4, 4), 2, 3, D, 3, **settings)


@pytest.mark.parametrize("model", ["language_model", "vision_classifier"])
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(
    ("source", "target", "match"),
    [
        (False, True, r"one symbol retriever per layer \(symbol_retriever\.0\..*shares one"),
        (
            True,
            False,
            r"one symbol retriever shared across layers \(symbol_retriever\.\w.*per layer",
        ),
    ],
    ids=["per_layer_into_shared", "shared_into_per_layer"],
)
def test_a_state_dict_with_the_other_kind_of_symbol_retriever_is_refused(
    model, strict, source, target, match
):
    """Per-layer retrievers into a shared one and back: a RuntimeError naming the keys and
    saying which is shared, strict or not (strict=False used to load the rest silently)."""
    state = retrieval_model(model, shared=source).state_dict()
    with pytest.raises(RuntimeError, match=match):
        retrieval_model(model, shared=target).load_state_dict(state, strict=strict)
    retrieval_model(model, shared=source).load_state_dict(state)  # the same kind loads


def test_torch_compile_smoke():
    """One graph (fullgraph: no break, the token check included), eager's logits. Every model x
    mechanism x backend, with gradients and under inductor: tests/test_compile.py."""
    torch.manual_seed(0)
    model = LanguageModel(
        20,
        D,
        1,
        attention="standard",
        attention_kwargs=dict(n_heads=2),
        max_block_size=8,
        backend="sdpa",
    ).eval()
    idx = torch.randint(0, 20, (2, 8))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager_decomp_partition")
    torch.testing.assert_close(compiled(idx)[0], model(idx)[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m(torch.randint(0, 20, (2, 13))), "length 13 > max_block_size=12"),
        (lambda m: m(torch.tensor([[1, 25]])), r"token ids in \[1, 25\]; valid ids are 0..19"),
        (lambda m: m(torch.rand(2, 5)), "integer token ids"),
        (
            lambda m: m(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)),
            "targets",
        ),
    ],
)
def test_language_model_input_errors(call, match):
    model = LanguageModel(
        20, D, 1, attention="standard", attention_kwargs=dict(n_heads=2), max_block_size=12
    )
    with pytest.raises(ValueError, match=match):
        call(model)


def test_vision_and_config_errors():
    model = VisionClassifier(
        (3, 8, 8), 4, 3, D, 1, attention="standard", attention_kwargs=dict(n_heads=2)
    )
    with pytest.raises(ValueError, match=r"\(B, 3, 8, 8\), got \(2, 3, 8, 9\)"):
        model(torch.randn(2, 3, 8, 9))
    with pytest.raises(ValueError, match="not divisible into 3x3 patches"):
        VisionClassifier((3, 8, 8), 3, 3, D, 1)
    with pytest.raises(ValueError, match="pool='max'"):
        VisionClassifier((3, 8, 8), 4, 3, D, 1, pool="max")
    with pytest.raises(ValueError, match="Did you mean 'rmsnorm'"):
        Block(d_model=D, attention_kwargs=dict(n_heads=2), norm_type="rms")
    with pytest.raises(ValueError, match="Did you mean 'swiglu'"):
        Block(d_model=D, attention_kwargs=dict(n_heads=2), activation="swiglo")
    with pytest.raises(ValueError, match="positional encoding: 'rotary'"):
        LanguageModel(
            20, D, 1, attention="standard", attention_kwargs=dict(n_heads=2), pos_enc="rotary"
        )
    with pytest.raises(ValueError, match="context must be given exactly when"):
        Block(d_model=D, attention_kwargs=dict(n_heads=2))(
            torch.randn(1, 3, D), context=torch.randn(1, 2, D)
        )


@pytest.mark.parametrize(
    "image_shape, patch_size, match",
    [
        ((0, 8, 8), 4, r"image_shape\[0\]=0: must be an integer >= 1"),  # the same logits
        ((3, 8, 8), True, r"patch_size=True: must be an integer >= 1"),  # taken as 1
        ((3, 8, 8), -2, r"patch_size=-2: must be an integer >= 1"),  # a reshape error
        ((3, 8, 8), 0, r"patch_size=0: must be an integer >= 1"),  # ZeroDivisionError
        ((3, 8, 8), (2, 0), r"patch_size\[1\]=0: must be an integer >= 1"),
        ((3, 8.0, 8), 4, r"image_shape\[1\]=8.0: must be an integer >= 1"),
        ((8, 8), 4, r"image_shape=\(8, 8\): must be \(channels, height, width\)"),
        ((3, 8, 8), (2, 2, 2), r"patch_size=\(2, 2, 2\): must be one int or \(height, width\)"),
    ],
)
def test_a_vision_classifier_refuses_a_bad_image_or_patch_size_by_name(
    image_shape, patch_size, match
):
    """Each was accepted (0 channels: every image gave the same logits; True as 1) or failed
    deep in the first forward or the patch arithmetic."""
    with pytest.raises(ValueError, match=f"^{match}"):
        VisionClassifier(image_shape, patch_size, 3, D, 1, attention_kwargs=dict(n_heads=2))


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm", "none"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_block_variants_take_a_module_or_a_name(norm_first, norm_type, activation):
    torch.manual_seed(0)
    by_name = Block(
        d_model=D,
        attention="standard",
        attention_kwargs=dict(n_heads=2),
        dff=None,
        activation=activation,
        dropout=0.0,
        norm_first=norm_first,
        norm_type=norm_type,
        causal=True,
    )
    by_module = Block(
        d_model=D,
        attention=az.build("standard", d_model=D, n_heads=2),
        attention_kwargs=None,
        dff=None,
        activation=activation,
        dropout=0.0,
        norm_first=norm_first,
        norm_type=norm_type,
        causal=True,
    )
    by_module.load_state_dict(by_name.state_dict())
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(by_module(x), by_name(x))
    if activation == "swiglu":
        assert by_name.ff_block.linear1.out_features == int(2 / 3 * 4 * D)


def test_positional_encodings_by_name():
    assert set(POSITIONAL) == {"none", "learned", "sinusoidal", "rope", "rope_half"}
    x = torch.randn(2, 5, D)
    assert torch.equal(build_positional("none", D, 8)(x), x)
    assert not torch.equal(build_positional("learned", D, 8)(x), x)
    sinusoidal = build_positional("sinusoidal", D, 8, scale=True)
    torch.testing.assert_close(sinusoidal(x), x * D**0.5 + sinusoidal.pe[:5])
    with pytest.raises(ValueError, match="length 9 exceeds"):
        build_positional("learned", D, 8)(torch.randn(1, 9, D))


def test_rope_half_split_is_interleaved_on_permuted_features():
    cos, sin = rotary_tables(8, 6)
    x = torch.randn(1, 2, 6, 8)
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # interleaved pair i = (2i, 2i+1) -> (i, i+4)
    interleaved = Rotary(cos, sin, interleaved=True).apply(x)
    half = Rotary(cos, sin, interleaved=False).apply(x[..., perm])
    torch.testing.assert_close(half, interleaved[..., perm])
    # relative positions: <R_m q, R_n k> depends on m - n only
    q, k = torch.randn(8), torch.randn(8)
    rot = Rotary(cos, sin)
    a = rot.apply(q.expand(1, 1, 6, 8).contiguous())[0, 0]
    b = rot.apply(k.expand(1, 1, 6, 8).contiguous())[0, 0]
    torch.testing.assert_close(a[3] @ b[1], a[4] @ b[2])


@pytest.mark.parametrize(
    ("mechanism", "kwargs"),
    [
        ("msa_row", dict(n_heads=2)),
        ("msa_row", dict(n_heads=2, tied=True)),
        ("msa_column", dict(n_heads=2)),
    ],
)
def test_msa_mechanisms_train_in_a_block_stack(mechanism, kwargs):
    """MSA attention is not for token sequences; it runs in the generic block on (B, R, C, D)."""
    assert mechanism in NOT_SEQUENCE
    torch.manual_seed(0)
    stack = torch.nn.Sequential(
        *(Block(d_model=D, attention=mechanism, attention_kwargs=kwargs) for _ in range(2))
    )
    msa, target = torch.randn(3, 4, 6, D), torch.randn(3, 4, 6, D)
    opt = torch.optim.AdamW(stack.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = (stack(msa) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_sequence_classifier_trains(mechanism):
    from attn_zoo.models import SequenceClassifier

    attention, extra, _ = MECHANISMS[mechanism]
    torch.manual_seed(0)
    model = SequenceClassifier(
        20, 3, D, 1, attention=mechanism, attention_kwargs=attention, max_len=8, **extra
    )
    idx = torch.randint(0, 20, (6, 8), generator=torch.Generator().manual_seed(4))
    if mechanism in CAUSAL_ONLY:
        with pytest.raises(ValueError, match="causal only"):
            model(idx)
    else:
        train(model, (idx, torch.arange(6) % 3))
    with pytest.raises(ValueError, match="pool='max'"):
        SequenceClassifier(20, 3, D, 1, pool="max")


@pytest.mark.parametrize("norm_first", [True, False])
def test_without_attention_residual_attentions_output_replaces_the_stream(norm_first):
    torch.manual_seed(0)
    settings = dict(d_model=D, attention="relational", dropout=0.0, norm_first=norm_first,
                    attention_kwargs=dict(n_heads=2))  # fmt: skip
    bottleneck = Block(**settings, attention_residual=False)
    x, symbols = (torch.randn(2, 5, D, dtype=torch.float64) for _ in range(2))
    bottleneck = bottleneck.double()
    attended = bottleneck.attn(bottleneck.norm1(x) if norm_first else x, symbols=symbols)
    if norm_first:
        expected = attended + bottleneck.ff_block(bottleneck.norm2(attended))
    else:
        stream = bottleneck.norm1(attended)
        expected = bottleneck.norm2(stream + bottleneck.ff_block(stream))
    torch.testing.assert_close(bottleneck(x, symbols), expected)
    residual = Block(**settings).double()  # the default: x + attention
    residual.load_state_dict(bottleneck.state_dict())
    skip = x + attended if norm_first else bottleneck.norm1(x + attended)
    assert not torch.allclose(residual(x, symbols), bottleneck(x, symbols))
    if norm_first:
        torch.testing.assert_close(
            residual(x, symbols), skip + residual.ff_block(residual.norm2(skip))
        )


def test_sequence_classifier_reads_vectors_with_input_dim():
    from attn_zoo.models import SequenceClassifier

    torch.manual_seed(0)
    model = SequenceClassifier(0, 2, D, 1, max_len=6, input_dim=5, attention_kwargs=dict(n_heads=2))
    assert isinstance(model.token_embedder, torch.nn.Linear)
    x = torch.randn(4, 6, 5)
    train(model, (x, torch.arange(4) % 2))
    with pytest.raises(ValueError, match=r"\(B, T, 5\) float vectors.*torch.int64 \(4, 6\)"):
        model(torch.zeros(4, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, T, 5\).*\(4, 6, 3\)"):
        model(torch.randn(4, 6, 3))
    with pytest.raises(ValueError, match="length 7 > max_len=6"):
        model(torch.randn(4, 7, 5))
    with pytest.raises(ValueError, match="input_dim=0"):
        SequenceClassifier(0, 2, D, 1, input_dim=0)


def test_flatten_pooling_reads_every_position_apart():
    from attn_zoo.models import SequenceClassifier

    torch.manual_seed(0)
    model = SequenceClassifier(20, 3, D, 1, max_len=6, pool="flatten", pos_enc="none",
                               attention_kwargs=dict(n_heads=2))  # fmt: skip
    assert model.final_out.in_features == 6 * D
    idx = torch.randint(0, 20, (5, 6), generator=torch.Generator().manual_seed(1))
    logits, _ = model(idx)
    # without positions the blocks are permutation-equivariant: the logits equal the final
    # layer applied to the permuted outputs, which a mean would not tell apart
    flipped, _ = model(idx.flip(1))
    h = model.blocks[0](model.token_embedder(idx))
    expected = model.final_out(model.norm(h.flip(1)).flatten(1))
    torch.testing.assert_close(flipped, expected)
    assert not torch.allclose(logits, flipped)
    train(model, (idx, torch.arange(5) % 3))
    with pytest.raises(ValueError, match="pool='flatten' reads sequences of length max_len=6"):
        model(idx[:, :4])
