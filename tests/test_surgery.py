"""Attention surgery (attn_zoo/interop/surgery.py): every registered mechanism (and a plugin's)
in place of the self-attention of tiny random Llama and Qwen2 models: `standard` gives the
original logits in float64 on every CPU softmax backend; every other mechanism trains and
generates, cached equal to uncached; swapped models save and load from a local folder;
unsupported models, implementations, head widths, names and kwargs are refused by name;
every model projection a mechanism does not start from is named."""

import copy
import logging
import re

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import attn_zoo as az  # noqa: E402
from attn_zoo.interop.surgery import (  # noqa: E402
    PROJECTIONS,
    RECORD,
    SwappedAttention,
    keeps_cache,
    load_swapped,
    split_mask,
    swap_attention,
    swapped_mechanisms,
)
from attn_zoo.kernels.dispatch import Call, family  # noqa: E402
from attn_zoo.kernels.softmax.masks import causal_mask  # noqa: E402

VOCAB, LENGTH, PAD, NEW = 64, 8, 3, 4
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query heads
    max_position_embeddings=64,
    initializer_range=0.2,  # peaked attention: misplaced positions or masks show
    pad_token_id=0,
)
MODELS = {  # model_type -> (config class, model class)
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # q, k, v projections with biases
    "mistral": (MistralConfig, MistralForCausalLM),
}
SYMBOLS = dict(
    symbol_retrieval="symbolic_attention", symbol_retrieval_kwargs=dict(n_symbols=4, n_heads=2)
)
KWARGS = {  # what a mechanism needs besides the model's sizes; a new mechanism needs nothing
    "relational": SYMBOLS,
    "dual": dict(n_heads_sa=2, n_heads_ra=2, ra_kwargs=dict(n_kv_heads=1), **SYMBOLS),
    "axial": dict(n_axes=1),  # one axis: the sequence
    "softcapped": dict(cap=5.0),
}
NOT_CAUSAL_LM = {"msa_row", "msa_column"}  # (B, rows, cols, D) alignments, never causal
SOFTMAX_CPU_FLOAT64 = [
    name
    for name, backend in family("softmax").backends.items()
    if backend.refusal(Call("cpu", torch.float64, frozenset({"causal", "gqa", "mask"}))) is None
]


def tiny(model_type: str, dtype=torch.float32, implementation="eager", seed=0) -> nn.Module:
    config_class, model_class = MODELS[model_type]
    torch.manual_seed(seed)
    config = config_class(**copy.deepcopy(SIZES))
    return model_class._from_config(config, attn_implementation=implementation, dtype=dtype)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def left_padded():
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, :PAD] = 0
    return mask


def greedy(model, ids, use_cache, **kwargs):
    """Greedy tokens and the logits of every step."""
    out = model.generate(
        ids, max_new_tokens=NEW, do_sample=False, use_cache=use_cache,
        return_dict_in_generate=True, output_logits=True, **kwargs,
    )  # fmt: skip
    return out.sequences, torch.stack(out.logits, dim=1)


def assert_generation_matches(model, ids, atol, **kwargs):
    """Cached greedy generation gives the uncached tokens and per-step logits."""
    tokens, logits = greedy(model, ids, True, **kwargs)
    again, reference = greedy(model, ids, False, **kwargs)
    assert tokens.shape == (ids.shape[0], LENGTH + NEW)
    assert torch.equal(tokens, again)
    torch.testing.assert_close(logits, reference, atol=atol, rtol=0)


# --- standard in place of the original: exact --------------------------------------------


def test_a_cpu_float64_softmax_backend_is_found():
    assert {"naive", "chunked"} <= set(SOFTMAX_CPU_FLOAT64), SOFTMAX_CPU_FLOAT64


def fast_first(cases: list, fast: int) -> list:
    """`cases` with all but the first `fast` marked slow (the default suite runs those)."""
    slow = [pytest.mark.slow]
    return [pytest.param(*c, marks=[] if i < fast else slow) for i, c in enumerate(cases)]


STANDARD_CASES = sorted(  # llama on every backend by default, the other models on naive
    ((model_type, backend) for model_type in MODELS for backend in SOFTMAX_CPU_FLOAT64),
    key=lambda case: (case[0] != "llama" and case[1] != "naive", case),
)


def assert_original_logits(swapped, original, ids, left_padded) -> None:
    """The logits of `swapped` are `original`'s to 1e-10 (float64), equal-length and
    left-padded (at real tokens)."""
    real = left_padded.bool()
    with torch.no_grad():
        for mask, rows in ((None, slice(None)), (left_padded, real)):
            want = original(ids, attention_mask=mask).logits[rows]
            got = swapped(ids, attention_mask=mask).logits[rows]
            torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    "model_type, backend",
    fast_first(STANDARD_CASES, len(SOFTMAX_CPU_FLOAT64) + len(MODELS) - 1),
)
def test_standard_gives_the_original_logits(model_type, backend, ids, left_padded):
    """float64: equal-length and left-padded logits (at real tokens) of the original model
    (sdpa: eager's softmax runs in float32), to 1e-10; the projections were copied (biases
    too: Qwen2), RoPE is the model's own, the masks eager's, and generation gives the
    original's tokens and logits, cached."""
    original = tiny(model_type, torch.float64, "sdpa").eval()
    swapped = swap_attention(tiny(model_type, torch.float64), "standard", backend=backend)
    assert len(swapped_mechanisms(swapped)) == SIZES["num_hidden_layers"]
    assert_original_logits(swapped, original, ids, left_padded)
    tokens, logits = greedy(swapped, ids, True, attention_mask=left_padded)
    want_tokens, want_logits = greedy(original, ids, True, attention_mask=left_padded)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logits, want_logits, atol=1e-10, rtol=0)


ADDED_HEADS = dict(  # dual attention: the model's 4 heads (2 kv) and 4 relational heads beside
    n_heads_sa=4, n_heads_ra=4, combine="sum", sa_kwargs=dict(n_kv_heads=2), **SYMBOLS
)


def test_dual_with_added_relational_heads_starts_as_the_original_and_they_learn(
    ids, left_padded, tmp_path, caplog
):
    """float64: dual attention combined by sum has its self-attention branch copied (every
    projection: none named) and its relational heads' output projection zeroed, so it gives
    the original's logits (equal-length and left-padded) to 1e-10; a training step makes the
    relational heads contribute (the logits move), and the trained model saves and loads."""
    original = tiny("llama", torch.float64, "sdpa").eval()
    with caplog.at_level(logging.WARNING, logger="attn_zoo"):
        swapped = swap_attention(tiny("llama", torch.float64), "dual", **ADDED_HEADS)
    assert "starts from none" not in caplog.text
    assert_original_logits(swapped, original, ids, left_padded)
    relational = [m.relational_attention for m in swapped_mechanisms(swapped).values()]
    optimizer = torch.optim.SGD(swapped.parameters(), lr=0.1)
    swapped.train()(ids, labels=ids).loss.backward()
    assert all(ra.wo.weight.grad.abs().sum() > 0 for ra in relational)
    optimizer.step()
    assert all(ra.wo.weight.abs().sum() > 0 for ra in relational)
    swapped.eval()
    with torch.no_grad():
        assert (swapped(ids).logits - original(ids).logits).abs().max() > 1e-4
    swapped.save_pretrained(tmp_path)
    again = load_swapped(tmp_path)  # the swap replayed (its zeroing too), then the weights
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, swapped(ids).logits, atol=0, rtol=0)


def test_without_the_copied_weights_standard_differs(ids):
    """The exactness test can fail: a fresh standard layer (weights not copied) is far off."""
    original = tiny("llama", torch.float64, "sdpa").eval()
    swapped = swap_attention(copy.deepcopy(original), "standard")
    with torch.no_grad():
        for mechanism in swapped_mechanisms(swapped).values():
            mechanism.wq.weight.normal_()
        diff = (swapped(ids).logits - original(ids).logits).abs().max()
    assert diff > 1e-2


@pytest.mark.parametrize("mechanism", ["standard", "gla"])
def test_a_head_width_other_than_d_model_over_heads_is_refused_before_any_change(mechanism):
    """config.head_dim 32 != hidden_size // num_attention_heads (Mistral-Nemo-like): the
    mechanisms' heads are d_model // n_heads wide, so no projection and no RoPE table fits."""
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(LlamaConfig(**SIZES, head_dim=32))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"config\.head_dim=32.*64 // 4 = 16"):
        swap_attention(model, mechanism)
    assert not getattr(model.config, RECORD, None)
    assert not any(isinstance(b.self_attn, SwappedAttention) for b in model.model.layers)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_standard_trains_as_the_original(ids):
    """The same loss and the same gradients (float64): every parameter the two models share,
    and the attention projections against the mechanism's copies of them."""
    original = tiny("llama", torch.float64, "sdpa")
    swapped = swap_attention(tiny("llama", torch.float64), "standard", backend="naive")
    for model in (original, swapped):
        model(ids, labels=ids).loss.backward()
    ours = dict(swapped.named_parameters())
    for name, param in original.named_parameters():
        mine = re.sub(r"self_attn\.(\w)_proj", r"self_attn.mechanism.w\1", name)
        torch.testing.assert_close(ours[mine].grad, param.grad, atol=1e-10, rtol=0, msg=mine)


def test_a_sliding_window_shorter_than_the_sequence_is_refused(ids):
    """Mistral's window, once the sequence passes it, is a mask no mechanism here follows."""
    config_class, model_class = MODELS["mistral"]
    config = config_class(**{**SIZES, "sliding_window": 4})
    model = swap_attention(
        model_class._from_config(config, attn_implementation="eager"), "standard"
    )
    with torch.no_grad():
        model(ids[:, :4])  # within the window: causal
        with pytest.raises(ValueError, match="not causal with key padding.*sliding window"):
            model(ids)
    # cached: the cache keeps the window only, so the mask covers fewer keys than were seen
    with pytest.raises(ValueError, match=r"covers the last 4 of 5 positions.*sliding window"):
        greedy(model, ids[:, :3], True)


@pytest.mark.parametrize("implementation", ["sdpa", "attn_zoo_chunked"])
def test_standard_is_exact_under_other_implementations_masks(implementation, ids, left_padded):
    """sdpa's and our implementations' boolean masks (None when nothing is padded) read as
    eager's additive ones."""
    from attn_zoo.interop.transformers import register

    register()
    original = tiny("llama", torch.float64, "sdpa").eval()
    swapped = swap_attention(tiny("llama", torch.float64, implementation), "standard")
    real = left_padded.bool()
    with torch.no_grad():
        want = original(ids, attention_mask=left_padded).logits[real]
        got = swapped(ids, attention_mask=left_padded).logits[real]
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


# --- every registered mechanism: trains and generates ------------------------------------


def check_trains_and_generates(model_type: str, mechanism: str, ids) -> None:
    """float64 (no near-tie of two tokens flips between cached and uncached runs)."""
    model = swap_attention(tiny(model_type, torch.float64), mechanism, **KWARGS.get(mechanism, {}))
    swapped = swapped_mechanisms(model)
    assert len(swapped) == SIZES["num_hidden_layers"]
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    for layer in swapped.values():
        grads = [p.grad for p in layer.parameters() if p.requires_grad]
        assert grads and all(g is not None and g.isfinite().all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)
    model.eval()
    if all(keeps_cache(m) for m in swapped.values()):
        assert model.generation_config.use_cache
        assert_generation_matches(model, ids, atol=1e-10)
        return
    # no cache: generate recomputes by default, and refuses a cache it cannot continue
    assert not model.generation_config.use_cache
    tokens = model.generate(ids, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(tokens, greedy(model, ids, False)[0])
    with pytest.raises(ValueError, match="it keeps no cache.*use_cache=False"):
        greedy(model, ids, True)


def sequence_mechanisms() -> list[str]:
    return [name for name in az.list_mechanisms() if name not in NOT_CAUSAL_LM]


@pytest.mark.parametrize("mechanism", ["gla", "sigmoid"])  # a recurrent state; no cache
def test_mechanisms_train_and_generate(mechanism, ids):
    check_trains_and_generates("llama", mechanism, ids)


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", sequence_mechanisms())
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_every_mechanism_trains_and_generates(model_type, mechanism, ids):
    """Every registered mechanism (the registry iterated: a new one is covered)."""
    check_trains_and_generates(model_type, mechanism, ids)


@pytest.mark.parametrize("mechanism", sorted(NOT_CAUSAL_LM))
def test_a_mechanism_that_is_no_causal_self_attention_is_refused(mechanism):
    model = tiny("llama")
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=f"mechanism '{mechanism}'.*cannot be a causal LM's"):
        swap_attention(model, mechanism)
    assert not swapped_mechanisms(model)  # nothing changed
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


ALL = {"q_proj", "k_proj", "v_proj", "o_proj"}
NOT_COPIED = {  # docs/surgery.md's table, for SIZES' grouped-query heads (4 heads, 2 kv heads)
    "gla": {"q_proj", "v_proj"},  # head_dim / 2 wide queries and keys, no grouped values
    "additive": {"k_proj", "v_proj"},  # no grouped keys and values
    "dual": ALL,  # combine "concat": its branches' heads d_model // (n_sa + n_ra) wide
    "axial": ALL,  # projections per axis
}


@pytest.mark.parametrize("mechanism", sequence_mechanisms())
def test_every_projection_starts_from_the_model_or_is_named(mechanism, caplog):
    """q_proj, k_proj, v_proj, o_proj each start a mechanism projection of the same shape, or
    the swap's warning names them; which ones, per mechanism, as docs/surgery.md says (a
    mechanism not in its table: the warning alone)."""
    model = tiny("llama", seed=2)
    layer = model.model.layers[0].self_attn
    original = {name: getattr(layer, name).weight.clone() for name in PROJECTIONS}
    with caplog.at_level(logging.WARNING, logger="attn_zoo"):
        swap_attention(model, mechanism, layers=[0], **KWARGS.get(mechanism, {}))
    new = swapped_mechanisms(model)[0]
    named = re.search(r"starts from none of these model projections: (.*)", caplog.text)
    not_copied = set(re.findall(r"\b[qkvo]_proj\b", named.group(1))) if named else set()
    for source, targets in PROJECTIONS.items():
        copied = any(
            isinstance(getattr(new, t, None), nn.Linear)
            and torch.equal(getattr(new, t).weight, original[source])
            for t in targets
        )
        assert copied != (source in not_copied), (source, caplog.text)
    if type(new).__module__.startswith("attn_zoo."):  # the zoo's own: in the table
        assert not_copied == NOT_COPIED.get(mechanism, set()), caplog.text


# --- a plugin's mechanism ------------------------------------------------------------------


def register_plugin():
    @az.register_mechanism("causal_mean")
    class CausalMean(az.AttentionMechanism):
        """A plugin: out_i = Wo mean_{j <= i} Wv x_j (no RoPE, no cache, no mask)."""

        def __init__(self, d_model: int, n_heads: int, backend: str = "auto"):
            super().__init__(backend)
            self.wv = nn.Linear(d_model, d_model, bias=False)
            self.wo = nn.Linear(d_model, d_model, bias=False)

        def forward(self, x, symbols=None, attn_mask=None, is_causal=False):
            if attn_mask is not None or not is_causal:
                raise ValueError("causal_mean: causal calls without a mask only")
            counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)
            return self.wo(self.wv(x).cumsum(dim=1) / counts[:, None])

    return CausalMean


def test_a_plugin_mechanism_trains_generates_saves_and_loads(
    restore_registries, ids, tmp_path, caplog
):
    register_plugin()
    with caplog.at_level(logging.WARNING, logger="attn_zoo"):
        check_trains_and_generates("qwen2", "causal_mean", ids)
    assert "runs without the model's rotary positions" in caplog.text
    model = swap_attention(tiny("qwen2"), "causal_mean", layers=[0]).eval()
    model.save_pretrained(tmp_path)
    again = load_swapped(tmp_path, attn_implementation="eager")  # the original layer's too
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, atol=0, rtol=0)


# --- caches --------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", fast_first([("standard",), ("gla",), ("additive",)], 1))
def test_beam_search_reorders_the_mechanism_state(mechanism, ids):
    """Beam search reorders the cache between steps: the mechanism's state (keys and values,
    a recurrent state, tuples of states) follows, so cached beams equal uncached ones
    (float64: in float32 two beams' scores may tie and swap between the runs)."""
    model = swap_attention(tiny("llama", torch.float64), mechanism).eval()
    tokens, logits = greedy(model, ids, True, num_beams=3)
    again, reference = greedy(model, ids, False, num_beams=3)
    assert torch.equal(tokens, again)
    torch.testing.assert_close(logits, reference, atol=1e-10, rtol=0)


def test_only_chosen_layers_are_swapped_and_generate_cached(ids):
    model = swap_attention(tiny("qwen2", torch.float64), "gla", layers=[1], gate_rank=4)
    blocks = model.model.layers
    assert not isinstance(blocks[0].self_attn, SwappedAttention)
    assert isinstance(blocks[1].self_attn, SwappedAttention)
    assert blocks[1].self_attn.mechanism.gate[0].out_features == 4
    assert_generation_matches(model, ids, atol=1e-10)


def test_a_static_cache_is_refused(ids):
    model = swap_attention(tiny("llama"), "standard").eval()
    with pytest.raises(ValueError, match="DynamicCache.*got StaticCache"):
        greedy(model, ids, True, cache_implementation="static")


def test_a_mechanism_that_takes_no_padding_says_so(ids, left_padded):
    model = swap_attention(tiny("llama"), "gla").eval()
    with pytest.raises(ValueError, match="gla attention takes no attn_mask"):
        model(ids, attention_mask=left_padded)


def test_padding_reaches_a_recurrent_mechanism(ids, left_padded):
    """linear attention (no RoPE: position-free) over a left-padded sequence gives, at its
    real tokens, the logits of the sequence without its padding; its recurrent cache takes no
    padding, so a padded prompt generates uncached only, and says so otherwise."""
    model = swap_attention(tiny("llama", torch.float64), "linear").eval()
    with torch.no_grad():
        padded = model(ids, attention_mask=left_padded).logits[1, PAD:]
        alone = model(ids[1:, PAD:]).logits[0]
    torch.testing.assert_close(padded, alone, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="takes no padding mask and the prompt was padded"):
        greedy(model, ids, True, attention_mask=left_padded)
    tokens, _ = greedy(model, ids, False, attention_mask=left_padded)
    assert tokens.shape == (2, LENGTH + NEW)
    assert_generation_matches(model, ids, atol=1e-10)  # unpadded: cached


def test_split_mask_reads_causal_padding_and_refuses_the_rest():
    n, past = 3, 2
    causal = causal_mask(n, past + n, "cpu", offset=past)
    keys = torch.tensor([True, True, True, True, True])
    assert split_mask(causal[None, None], n, past) is None
    padded = causal & torch.tensor([False, True, True, True, True])
    assert split_mask(padded[None, None], n, past).tolist() == [[[[0, 1, 1, 1, 1]]]]
    additive = torch.zeros(1, 1, n, past + n).masked_fill(~padded, torch.finfo().min)
    assert torch.equal(split_mask(additive, n, past), split_mask(padded[None, None], n, past))
    window = causal & ~causal_mask(n, past + n, "cpu", offset=past - 2)  # sees 2 keys back
    with pytest.raises(ValueError, match="not causal with key padding"):
        split_mask(window[None, None], n, past)
    with pytest.raises(ValueError, match=r"\(B, 1, 3, 5\)"):
        split_mask(keys[None, None, None], n, past)
    cropped = causal[None, None, :, 1:]  # a sliding window cache's: the first key dropped
    with pytest.raises(ValueError, match="covers the last 4 of 5 positions.*sliding window"):
        split_mask(cropped, n, past)


# --- saving and loading --------------------------------------------------------------------


def test_save_and_load_round_trip(ids, tmp_path):
    model = tiny("qwen2", torch.float64)
    swap_attention(model, "gla", layers=[0], gate_rank=4)
    swap_attention(model, "differential", layers=[1], backend="chunked")
    model.eval().save_pretrained(tmp_path)
    again = load_swapped(tmp_path)
    assert [r["mechanism"] for r in getattr(again.config, RECORD)] == ["gla", "differential"]
    mechanisms = swapped_mechanisms(again)
    assert mechanisms[0].gate[0].out_features == 4 and mechanisms[1].backend == "chunked"
    assert next(again.parameters()).dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_loading_an_unswapped_folder_says_what_to_use(tmp_path):
    tiny("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="records no attention swap.*from_pretrained"):
        load_swapped(tmp_path)


# --- refusals ------------------------------------------------------------------------------


def test_an_unsupported_architecture_is_refused_by_name():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB))
    with pytest.raises(ValueError, match=r"llama, mistral, qwen2; got GPT2LMHeadModel.*'gpt2'"):
        swap_attention(gpt2, "standard")


@pytest.mark.parametrize(
    "call, message",
    [
        (dict(mechanism="glaa"), r"unknown mechanism: 'glaa'\. Did you mean 'gla'\?"),
        (dict(mechanism="gla", gate_rnk=4), r"'gate_rnk'\. Did you mean 'gate_rank'\?"),
        (dict(mechanism="gla", backend="fast"), r"backend for GatedLinearAttention: 'fast'"),
        (dict(mechanism="gla", layers=[2]), r"layers=\[2\]: .* indices in 0\.\.1"),
        (dict(mechanism="gla", layers=[0, 0]), r"layers=\[0, 0\]"),
        (dict(mechanism="gla", rope="yes"), r"rope='yes': must be 'auto', True or False"),
        (
            dict(mechanism="gla", rope=True),
            r"rope=True: mechanism 'gla' cannot take the model's",
        ),
        (dict(mechanism="gla", tau=-1.0), r"tau=-1\.0: must be a positive number"),
        (dict(mechanism="dual"), r"cannot build mechanism 'dual'.*n_heads_sa"),
        (dict(mechanism="relational"), r"'relational'.*cannot be a causal LM's.*needs symbols"),
        (dict(mechanism="axial"), r"'axial'.*cannot be a causal LM's.*expected 4-D"),
        (dict(mechanism="standard", score_mod=len), r"must be JSON values"),
    ],
)
def test_bad_arguments_are_refused_before_any_change(call, message):
    model = tiny("llama")
    with pytest.raises(ValueError, match=message):
        swap_attention(model, **call)
    assert not swapped_mechanisms(model) and not getattr(model.config, RECORD, None)


# --- the swapped model's own state ----------------------------------------------------------


@pytest.mark.parametrize("training", [False, True])
def test_a_swapped_layer_takes_the_mode_of_the_layer_it_replaces(ids, training):
    """The hostile pass: after ``model.eval()`` the swapped layers were left in training mode,
    so attention dropout (the model's `attention_dropout`, which the mechanism takes) changed
    the logits of an evaluated model from call to call."""
    config = LlamaConfig(**copy.deepcopy(SIZES), attention_dropout=0.5)
    model = LlamaForCausalLM._from_config(config, attn_implementation="eager").train(training)
    swap_attention(model, "standard", layers=[0])
    swapped = model.model.layers[0].self_attn
    assert all(module.training == training for module in swapped.modules())
    if not training:
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_the_swap_record_stays_with_the_swapped_model(tmp_path):
    """The hostile pass: the record went into the config object the model shares with whatever
    built it, so a second model built from that config saved a swap it never had."""
    config = LlamaConfig(**copy.deepcopy(SIZES))
    swapped = swap_attention(LlamaForCausalLM._from_config(config), "linear", layers=[1])
    assert swapped.model.config is swapped.config
    assert [r["mechanism"] for r in getattr(swapped.config, RECORD)] == ["linear"]
    other = LlamaForCausalLM._from_config(config)
    assert not getattr(other.config, RECORD, None)
    other.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="records no attention swap"):
        load_swapped(tmp_path)


def test_a_swapped_layer_is_not_swapped_again():
    model = swap_attention(tiny("llama"), "gla", layers=[1])
    with pytest.raises(ValueError, match=r"layers \[1\] of the model are swapped already"):
        swap_attention(model, "linear", layers=[0, 1])
    assert not isinstance(model.model.layers[0].self_attn, SwappedAttention)  # nothing changed


# --- the eighth hostile pass ------------------------------------------------------------------


def test_load_swapped_reads_the_weights_save_pretrained_wrote_only(ids, tmp_path):
    """A stale model_old.safetensors beside model.safetensors was merged in, by name order
    over it (logits 1.28 off); a sharded save loads from its index; a folder without either is
    refused by name."""
    model = swap_attention(tiny("llama", torch.float64), "linear").eval()
    model.save_pretrained(tmp_path / "old")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "new")
    (tmp_path / "old" / "model.safetensors").rename(tmp_path / "new" / "model_old.safetensors")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert not (tmp_path / "sharded" / "model.safetensors").exists()
    with torch.no_grad():
        want = model(ids).logits
        for folder in ("new", "sharded"):
            got = load_swapped(tmp_path / folder)(ids).logits
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    (tmp_path / "new" / "model.safetensors").unlink()  # only the stale copy left
    with pytest.raises(ValueError, match=f"{tmp_path / 'new'}: neither model.safetensors"):
        load_swapped(tmp_path / "new")


def test_output_attentions_is_refused_by_the_swapped_layer(ids):
    """transformers collects the weights of its own attention modules: with layer 0 swapped,
    attentions[0] was layer 1's, silently. Refused (by argument or config) with what works."""
    model = swap_attention(tiny("llama"), "standard", layers=[1]).eval()
    with torch.no_grad():
        with pytest.raises(ValueError, match="layer 1: output_attentions=True.*record_attention"):
            model(ids, output_attentions=True)
        model.config.output_attentions = True
        with pytest.raises(ValueError, match="layer 1: output_attentions=True"):
            model(ids)
        assert len(model(ids, output_attentions=False).logits) == len(ids)


def test_a_dual_layer_whose_self_attention_keeps_no_cache_generates_uncached(ids):
    """dual's supports_cache ignored its self-attention branch (prefix_lm: no cache), so
    swap_attention left generate's cache on and generate failed at the prefill."""
    prefix = {"mask_mod": {"name": "prefix_lm", "prefix": 2}}
    layer = az.build("dual", d_model=64, n_heads_sa=4, n_heads_ra=0, sa_kwargs=prefix)
    assert not layer.supports_cache
    model = swap_attention(tiny("llama"), "dual", n_heads_sa=4, n_heads_ra=0, sa_kwargs=prefix)
    assert not model.generation_config.use_cache
    tokens = model.eval().generate(ids, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(tokens, greedy(model, ids, False)[0])


def test_a_cache_the_original_model_filled_is_refused_by_name(ids):
    """Its layers hold the model's keys and values, not our position markers: cache.update
    crashed ("Sizes of tensors must match") before the message naming the case."""
    model = tiny("llama", implementation="sdpa").eval()
    with torch.no_grad():
        cache = model(ids[:, :5], use_cache=True).past_key_values
        swap_attention(model, "standard")
        with pytest.raises(ValueError, match="layer 0: .* 5 positions.*filled before the swap"):
            model(ids[:, 5:6], cache=cache, use_cache=True)


def test_differential_takes_half_the_models_heads_and_keeps_its_rotary_positions(caplog):
    """A differential head's two maps are two of the model's heads (its
    `model_heads_per_head`): swapped into 4 heads with 2 key/value heads it has 2 and 1, each
    map as wide as the model's heads, so every projection is the model's and the model's RoPE
    applies (with 4 heads its maps were half as wide: no RoPE, a warning)."""
    model = tiny("llama", seed=2)
    with caplog.at_level(logging.WARNING, logger="attn_zoo"):
        swap_attention(model, "differential", layers=[0])
    layer = model.model.layers[0].self_attn
    assert isinstance(layer, SwappedAttention) and layer.rope, caplog.text
    assert (layer.mechanism.n_heads, layer.mechanism.n_kv_heads) == (2, 1)
    assert "without the model's rotary positions" not in caplog.text
