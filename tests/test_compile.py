"""torch.compile(fullgraph=True) of every model with every sequence mechanism on every backend
that serves it on CPU: one graph (a graph break is an error), outputs and gradients as eager.

The grid: LanguageModel, SequenceClassifier, VisionClassifier and Seq2Seq, each with standard,
relational, dual, axial (one axis: the sequence), additive, linear, differential, sigmoid,
softcapped and gated linear attention in its blocks (Seq2Seq: encoder and decoder, a standard
encoder for gla, which is causal only and refused by the classifiers; its cross-attention stays
on `auto`), on `auto` and every
backend name the mechanism accepts (`az.list_backends`). A backend that cannot run on CPU is
skipped with its own reason (xformers, triton: CUDA only; the triton op's tracing is tested
on fake CUDA tensors in test_relational_triton.py; flex: FlexAttention's CPU path is wrong at
some shapes, asserted refused below); one that serves no gradient on CPU would be compared in
forward only, as eager serves it. Tolerances as the kernel tests': outputs atol
1e-5 / rtol 1e-4, gradients of every parameter atol 5e-5 / rtol 1e-4.

Models compile with the "aot_eager_decomp_partition" backend: Dynamo captures the whole forward
(fullgraph) and AOTAutograd traces forward and backward with fake tensors, with inductor's
decompositions and partitioner: the graphs inductor receives, and everything that makes a
model traceable (custom ops' fake kernels and autograd formulas included), without inductor's
C++ code generation (30-40 s a model on this 2-core CPU). (Plain "aot_eager" fails on linear
attention's backward for a reason outside attn_zoo: the meta kernel of aten.elu_backward gives
other strides than the CPU kernel, and a traced view of it fails at run time; inductor and the
decomposed graph are right.)

A compile costs 2-16 s here, so the default run takes `auto` (what a grid runs) as DEFAULT_AUTO
says: every mechanism once and every model once, not their product (a mechanism's module is
the same in every model; a model's embedding, head and masks the same with every mechanism):
seq2seq (encoder, decoder and cross-attention) with standard attention, the sequence
classifier with dual (softmax and relational at once, not causal), the vision classifier with
axial, and the language model with the rest (gla is causal only). The rest of the grid (every
named backend, every other (model, mechanism) pair), inductor itself on the standard and
relational language models, and dynamic lengths are `@pytest.mark.slow`: about 10 minutes more
(`-m "not slow"` leaves them out).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import attn_zoo as az
from attn_zoo.kernels import UnsupportedCallError
from attn_zoo.kernels.dispatch import Call, family
from attn_zoo.mechanisms.registry import mechanism_class
from attn_zoo.models import LanguageModel, Seq2Seq, SequenceClassifier, VisionClassifier
from attn_zoo.models.block import Block
from attn_zoo.models.common import check_tokens

D = 8
SYMBOLS = dict(
    symbol_retrieval="symbolic_attention", symbol_retrieval_kwargs=dict(n_symbols=3, n_heads=2)
)
MECHANISMS = {  # name -> (attention kwargs, model kwargs, language model positions)
    "standard": (dict(n_heads=2), {}, "rope"),
    "relational": (dict(n_heads=2, n_relations=2), SYMBOLS, "rope"),
    "dual": (dict(n_heads_sa=1, n_heads_ra=1), SYMBOLS, "rope"),
    "axial": (dict(n_heads=2, n_axes=1), {}, "learned"),
    "additive": (dict(n_heads=2), {}, "learned"),
    "linear": (dict(n_heads=2), {}, "learned"),
    "differential": (dict(n_heads=2), {}, "rope"),
    "sigmoid": (dict(n_heads=2), {}, "rope"),
    "softcapped": (dict(n_heads=2), {}, "rope"),
    "gla": (dict(n_heads=2), {}, "learned"),
}
CAUSAL_ONLY = {"gla"}  # refused in non-causal blocks: Seq2Seq gets a standard encoder for it
NON_CAUSAL_MODELS = {"sequence_classifier", "vision_classifier"}
DEFAULT_AUTO = {  # model -> the mechanisms of its default cases (on `auto`)
    "language_model": {"relational", "additive", "linear", "differential", "sigmoid",
                       "softcapped", "gla"},
    "sequence_classifier": {"dual"},
    "vision_classifier": {"axial"},
    "seq2seq": {"standard"},
}  # fmt: skip
NOT_SEQUENCE = {"msa_row", "msa_column"}  # (B, rows, cols, D) inputs: no sequence model takes them
KERNEL_FAMILIES = {"dual": ("softmax", "relational")}  # composite mechanisms: their branches
MODELS = ("language_model", "sequence_classifier", "vision_classifier", "seq2seq")
OUTPUTS = dict(atol=1e-5, rtol=1e-4)
GRADS = dict(atol=5e-5, rtol=1e-4)
GRID_BACKEND = "aot_eager_decomp_partition"
VOCAB, CLASSES, T = 11, 3, 6


def build(model: str, mechanism: str) -> tuple[torch.nn.Module, tuple]:
    """A one-layer `model` with `mechanism` attention, and a batch for it (inputs, targets)."""
    attention, extra, lm_positions = MECHANISMS[mechanism]
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, T), generator=gen)
    labels = torch.tensor([0, 2])
    common = dict(attention=mechanism, attention_kwargs=attention, **extra)
    if model == "language_model":
        m = LanguageModel(VOCAB, D, 1, max_block_size=T, pos_enc=lm_positions, **common)
        return m, (tokens, torch.roll(tokens, -1, 1))
    if model == "sequence_classifier":
        return SequenceClassifier(VOCAB, CLASSES, D, 1, max_len=T, **common), (tokens, labels)
    if model == "vision_classifier":
        images = torch.randn(2, 1, 4, 4, generator=gen)
        return VisionClassifier((1, 4, 4), 2, CLASSES, D, 1, **common), (images, labels)
    encoder, encoder_kwargs = (
        ("standard", dict(n_heads=2)) if mechanism in CAUSAL_ONLY else (mechanism, attention)
    )
    m = Seq2Seq(
        VOCAB, VOCAB + 2, D, 1, 1, encoder_attention=encoder,
        encoder_attention_kwargs=encoder_kwargs, decoder_attention=mechanism,
        decoder_attention_kwargs=attention,
        cross_attention_kwargs=dict(n_heads=2), in_block_size=T, out_block_size=T, **extra,
    )  # fmt: skip
    tgt = torch.randint(0, VOCAB + 2, (2, T - 1), generator=gen)
    return m, (tokens[:, :-1], tgt, torch.roll(tgt, -1, 1))


def set_block_backend(model: torch.nn.Module, backend: str) -> None:
    """`backend` for every block's own attention (not Seq2Seq's standard cross-attention)."""
    for block in model.modules():
        if isinstance(block, Block):
            block.attn.backend = backend


def step(model, batch, grad: bool):
    """(outputs, loss, {parameter: grad}) of one forward (and backward) pass."""
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad):
        out, loss = model(*batch)
    if not grad:
        return out, loss, {}
    loss.backward()
    params = getattr(model, "_orig_mod", model).named_parameters()  # compiled: the model's own
    grads = {n: p.grad.clone() for n, p in params if p.grad is not None}
    return out.detach(), loss.detach(), grads


def eager_reference(model, batch):
    """(grad, eager outputs): with gradients where the backend serves them on CPU, else
    forward only (eager refuses the backward call the same way)."""
    try:
        return True, step(model, batch, grad=True)
    except UnsupportedCallError as err:
        if "grad" not in str(err):
            raise
        return False, step(model, batch, grad=False)


def compiled_agrees(model_name, mechanism, backend, compile_backend=GRID_BACKEND) -> None:
    model, batch = build(model_name, mechanism)
    set_block_backend(model, backend)
    grad, (out, loss, grads) = eager_reference(model, batch)
    torch._dynamo.reset()  # no cache entries (nor recompile limits) carried between cases
    counter = CompileCounterWithBackend(compile_backend)
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    c_out, c_loss, c_grads = step(compiled, batch, grad)
    assert counter.frame_count == 1, f"{counter.frame_count} graphs compiled, expected one"
    torch.testing.assert_close(c_out, out, **OUTPUTS)
    torch.testing.assert_close(c_loss, loss, **OUTPUTS)
    assert c_grads.keys() == grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(c_grads[name], g, **GRADS, msg=lambda m, n=name: f"{n}: {m}")


def kernels(mechanism: str, backend: str) -> tuple[tuple[str, str], ...]:
    """(family, backend) for each kernel family the mechanism calls: what `backend` resolves to
    on CPU for a call with gradients where one is served, else without."""
    families = KERNEL_FAMILIES.get(mechanism, (mechanism_class(mechanism).kernel_family,))
    picked = []
    for name in families:
        chosen = backend
        for features in (frozenset({"grad"}), frozenset()):
            try:
                chosen = family(name).select(backend, Call("cpu", torch.float32, features)).name
                break
            except UnsupportedCallError:
                continue
        picked.append((name, chosen))
    return tuple(picked)


# (model, mechanism, backend) -> why it does not compile (xfail, strict: a fix is noticed).
# Empty: every combination a CPU serves compiles.
# Softcapped attention runs the softmax chunked kernel with a score mod, whose backward takes
# the mod's derivative with torch.autograd.grad on each tile: a graph break under Dynamo.
NOT_TRACEABLE: dict[tuple[str, str, str], str] = {
    (model, "softcapped", backend): "the chunked softmax kernel's backward calls "
    "torch.autograd.grad for the score mod's derivative (Dynamo: trace_autograd_ops=False)"
    for model in MODELS
    for backend in ("auto", "chunked")
}


def grid():
    """Every (model, mechanism, backend). Slow unless an `auto` case of DEFAULT_AUTO."""
    for model in MODELS:
        for mechanism in MECHANISMS:
            for backend in ["auto", *az.list_backends(mechanism)]:
                marks = []
                ok, why = az.backend_status(mechanism, backend, device="cpu")
                if not ok:
                    marks.append(pytest.mark.skip(reason=f"cannot run on CPU: {why}"))
                elif mechanism in CAUSAL_ONLY and model in NON_CAUSAL_MODELS:
                    marks.append(
                        pytest.mark.skip(
                            reason=f"{mechanism} is causal only: {model} "
                            "refuses it (tests/test_models.py)"
                        )
                    )
                elif backend != "auto" or mechanism not in DEFAULT_AUTO[model]:
                    marks.append(pytest.mark.slow)
                if (model, mechanism, backend) in NOT_TRACEABLE:
                    reason = NOT_TRACEABLE[model, mechanism, backend]
                    marks.append(pytest.mark.xfail(reason=reason, strict=True))
                yield pytest.param(model, mechanism, backend, marks=marks)


def test_every_sequence_mechanism_is_in_the_grid():
    assert set(az.list_mechanisms()) == set(MECHANISMS) | NOT_SEQUENCE


def test_the_default_cases_take_every_mechanism_once_and_every_model():
    """DEFAULT_AUTO, the compiles of the default run: each mechanism in one model's cases (a
    causal-only one in a causal model), and every model in the grid with one at least."""
    assert sorted(m for mechanisms in DEFAULT_AUTO.values() for m in mechanisms) == sorted(
        MECHANISMS
    )
    assert DEFAULT_AUTO.keys() == set(MODELS) and all(DEFAULT_AUTO.values())
    assert not CAUSAL_ONLY & set().union(*(DEFAULT_AUTO[model] for model in NON_CAUSAL_MODELS))


def test_flex_is_refused_on_cpu_so_the_grid_skips_it():
    """flex ran in the grid's forward-only cases; FlexAttention's CPU path is wrong at some
    shapes, so every mechanism that offers flex refuses it on CPU with the reason."""
    offering = [m for m in MECHANISMS if "flex" in az.list_backends(m)]
    assert offering
    for mechanism in offering:
        ok, why = az.backend_status(mechanism, "flex", device="cpu")
        assert not ok and "FlexAttention's CPU path gives wrong results" in why, mechanism


def test_auto_resolves_on_cpu_to_the_kernels_the_grid_expects():
    """What the default cases stand for: `auto` on CPU is the fused C++ relational kernel, SDPA
    and the additive scan (if these change, so does what the default run covers)."""
    assert kernels("standard", "auto") == (("softmax", "sdpa"),)
    assert kernels("additive", "auto") == (("additive", "scan"),)
    assert kernels("linear", "auto") == (("linear", "chunked"),)
    if az.backend_status("relational", "cpp")[0]:  # where the C++ kernel builds
        assert kernels("relational", "auto") == (("relational", "cpp"),)
        assert kernels("dual", "auto") == (("softmax", "sdpa"), ("relational", "cpp"))


@pytest.mark.parametrize(("model", "mechanism", "backend"), list(grid()))
def test_fullgraph_compile_matches_eager(model, mechanism, backend):
    compiled_agrees(model, mechanism, backend)


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["standard", "relational"])
def test_inductor_language_model_matches_eager(mechanism):
    """The default compiler end to end (C++ code generation; the cpp kernel an extern call)."""
    compiled_agrees("language_model", mechanism, "auto", compile_backend="inductor")


@pytest.mark.slow
def test_relational_language_model_compiles_with_dynamic_lengths():
    """dynamic=True, three sequence lengths: fullgraph, eager's outputs (the cpp op's fake
    kernel takes symbolic shapes)."""
    model, (idx, targets) = build("language_model", "relational")
    lengths = (T, T - 2, T - 1)
    with torch.no_grad():
        expected = [model(idx[:, :n], targets[:, :n])[0] for n in lengths]
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=GRID_BACKEND)
    for n, reference in zip(lengths, expected, strict=True):
        out, loss = compiled(idx[:, :n].contiguous(), targets[:, :n].contiguous())
        loss.backward()
        torch.testing.assert_close(out, reference, **OUTPUTS)


def test_token_check_is_in_the_graph_without_a_host_read():
    """check_tokens under compile: no graph break (fullgraph), no `.item()` (a graph with no
    data-dependent scalar), and an out-of-range id still fails, by a device-side assertion
    naming the valid ids; eager keeps the message with the offending range."""

    def embed(idx):
        check_tokens("idx", idx, VOCAB, T)
        return idx * 2

    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(embed, fullgraph=True, backend=capture)
    good = torch.tensor([[0, VOCAB - 1]])
    torch.testing.assert_close(compiled(good), good * 2)
    targets = {str(node.target) for node in graphs[0].graph.nodes}
    assert not any("item" in t or "local_scalar_dense" in t for t in targets), targets
    assert any("_assert_async" in t for t in targets), targets
    for bad in ([[0, VOCAB]], [[-1, 0]]):
        with pytest.raises(RuntimeError, match=f"idx has token ids outside 0..{VOCAB - 1}"):
            compiled(torch.tensor(bad))
    with pytest.raises(ValueError, match=rf"token ids in \[0, {VOCAB}\]; valid ids are 0..10"):
        check_tokens("idx", torch.tensor([[0, VOCAB]]), VOCAB, T)
    # shape checks stay Python raises, traced at compile time: with fullgraph=True Dynamo
    # reports the ValueError inside its own error (a raise is not capturable), without it the
    # ValueError itself
    too_long = torch.zeros(1, T + 1, dtype=torch.long)
    with pytest.raises(Exception, match="length 7 > max_block_size=6"):
        compiled(too_long)
    with pytest.raises(ValueError, match="length 7 > max_block_size=6"):
        torch.compile(embed, backend=capture)(too_long)


@pytest.mark.slow
def test_token_check_under_inductor():
    """The device-side assertion as inductor lowers it (in the generated kernel)."""

    def embed(idx):
        check_tokens("idx", idx, VOCAB, T)
        return idx * 2

    torch._dynamo.reset()
    compiled = torch.compile(embed, fullgraph=True)
    torch.testing.assert_close(compiled(torch.tensor([[1, 2]])), torch.tensor([[2, 4]]))
    with pytest.raises(RuntimeError, match="idx has token ids outside 0..10"):
        compiled(torch.tensor([[1, VOCAB]]))


def test_constant_when_compiled_is_torchs_assume_constant_result():
    """Our marker (set without importing torch._dynamo) is the one torch's decorator sets, and
    Dynamo honours it: a marked function runs once, while tracing, and its result is a constant
    of the graph (unmarked, its side effect would be replayed on every call)."""
    from attn_zoo.kernels.dispatch import constant_when_compiled

    def ours():
        pass

    def theirs():
        pass

    constant_when_compiled(ours)
    torch.compiler.assume_constant_result(theirs)
    assert vars(ours) == vars(theirs) != {}

    calls = []

    @constant_when_compiled
    def scale() -> float:
        calls.append(1)
        return 3.0

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * scale(), fullgraph=True, backend="eager")
    for _ in range(3):
        torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 3.0))
    assert len(calls) == 1


@pytest.mark.parametrize("backend", ["sdpa", "chunked", "naive"])
def test_a_mask_mod_compiles_with_its_block_mask_classified_in_the_graph(backend):
    """The eleventh hostile pass: compiling a model whose attention has a mask mod failed on
    sdpa and chunked (Dynamo traced into the block-mask cache, whose keys hold code objects:
    "SyntaxError: invalid syntax"). Under compile the cache is skipped and the tiles are
    classified in the graph (the Python loop over them breaks it: no fullgraph), outputs and
    gradients as eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    window = {"name": "sliding_window", "window": 5}
    model = LanguageModel(VOCAB, d_model=D, n_layers=1, max_block_size=40, pos_enc="rope",
                          attention="standard", backend=backend,
                          attention_kwargs=dict(n_heads=2, mask_mod=window))  # fmt: skip
    idx = torch.randint(0, VOCAB, (2, 33))
    out, loss = model(idx, idx)
    loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    compiled_out, compiled_loss = torch.compile(model, backend=GRID_BACKEND)(idx, idx)
    compiled_loss.backward()
    torch.testing.assert_close(compiled_out, out, **OUTPUTS)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], **GRADS, msg=name)
