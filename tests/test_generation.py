"""Cached generation (KV cache, or recurrent state) against the uncached path: equal tokens,
and the logits of every cached step equal to the uncached forward's last position, for every
sequence mechanism and symbol retriever; prefill, chunked prefill, and running past
max_block_size (where generation falls back to recomputing the cropped window)."""

import math

import pytest
import torch

from attn_zoo.mechanisms.cache import Cache, LayerCache
from attn_zoo.models import LanguageModel

VOCAB, D, LAYERS, BLOCK = 23, 16, 2, 20


def symbols(name: str, **kwargs) -> dict:
    return dict(symbol_retrieval=name, symbol_retrieval_kwargs=kwargs)


SYMBOLIC = symbols("symbolic_attention", n_symbols=5, n_heads=2)
POSITIONAL = symbols("positional_symbols", max_length=BLOCK)
RELATIVE = symbols("position_relative", max_rel_pos=3)

CASES = {  # id -> (attention, attention kwargs, model kwargs, positions)
    "standard-learned": ("standard", dict(n_heads=2), {}, "learned"),
    "standard-sinusoidal": ("standard", dict(n_heads=2), {}, "sinusoidal"),
    "standard-rope": ("standard", dict(n_heads=4), {}, "rope"),
    "standard-gqa-rope_half": ("standard", dict(n_heads=4, n_kv_heads=2), {}, "rope_half"),
    "standard-nopos": ("standard", dict(n_heads=2), {}, "none"),
    "relational-symbolic": ("relational", dict(n_heads=2, n_relations=3), SYMBOLIC, "rope"),
    "relational-positional": (
        "relational",
        dict(n_heads=2, n_relations=3),
        POSITIONAL,
        "sinusoidal",
    ),
    "relational-relative": ("relational", dict(n_heads=2, n_relations=3), RELATIVE, "rope"),
    "relational-relative-gqa": (
        "relational",
        dict(n_heads=4, n_kv_heads=2, n_relations=2, rel_activation="tanh"),
        RELATIVE,
        "learned",
    ),
    "relational-per-layer-symbols": (
        "relational",
        dict(n_heads=2),
        dict(POSITIONAL, shared_symbol_retriever=False),
        "learned",
    ),
    "relational-own-retriever": (
        "relational",
        dict(
            n_heads=2,
            symbol_retrieval="positional_symbols",
            symbol_retrieval_kwargs=dict(max_length=BLOCK),
        ),
        {},
        "rope",
    ),  # fmt: skip
    "dual-symbolic": ("dual", dict(n_heads_sa=1, n_heads_ra=1), SYMBOLIC, "rope"),
    "dual-positional": ("dual", dict(n_heads_sa=2, n_heads_ra=2), POSITIONAL, "learned"),
    "dual-relative": ("dual", dict(n_heads_sa=1, n_heads_ra=1), RELATIVE, "rope"),
    "dual-shared-params": (
        "dual",
        dict(n_heads_sa=2, n_heads_ra=2, share_attn_params=True),
        SYMBOLIC,
        "rope",
    ),
    "linear": ("linear", dict(n_heads=2), {}, "learned"),
    "linear-gqa": ("linear", dict(n_heads=4, n_kv_heads=2, key_dim=6), {}, "sinusoidal"),
    "additive": ("additive", dict(n_heads=2), {}, "learned"),
    "differential-rope": ("differential", dict(n_heads=2), {}, "rope"),
    "differential-gqa": ("differential", dict(n_heads=4, n_kv_heads=2), {}, "learned"),
    "sigmoid-fixed-bias": ("sigmoid", dict(n_heads=2, bias=-math.log(BLOCK)), {}, "rope"),
    "softcapped": ("softcapped", dict(n_heads=2, cap=2.0), {}, "rope"),
    "gla": ("gla", dict(n_heads=2), {}, "learned"),
}


def model_for(case: str, dtype=torch.float64, **settings) -> LanguageModel:
    attention, kwargs, extra, pos_enc = CASES[case]
    torch.manual_seed(0)
    model = LanguageModel(
        VOCAB,
        D,
        LAYERS,
        max_block_size=BLOCK,
        pos_enc=pos_enc,
        attention=attention,
        attention_kwargs=kwargs,
        **extra,
        **settings,
    )
    return model.to(dtype).eval()


def prompt(batch: int = 3, length: int = 5) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))


def uncached_step_logits(model: LanguageModel, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """The logits the uncached path samples each token after `start` from: (B, steps, V)."""
    with torch.no_grad():
        return torch.stack(
            [
                model(tokens[:, max(0, t - model.max_block_size) : t])[0][:, -1]
                for t in range(start, tokens.shape[1])
            ],
            dim=1,
        )


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_greedy_generation_equals_uncached(case):
    model = model_for(case)
    assert model.supports_cache()
    idx = prompt()
    new = BLOCK - idx.shape[1]  # up to max_block_size exactly: every step from the cache
    cached, cached_logits = model.generate(idx, new, temperature=0, return_logits=True)
    assert torch.equal(cached, model.generate(idx, new, temperature=0, use_cache=False))
    reference = uncached_step_logits(model, cached, idx.shape[1])
    torch.testing.assert_close(cached_logits, reference, rtol=0, atol=1e-12)


FAMILIES = ["standard-rope", "relational-positional", "dual-relative", "linear", "additive", "gla"]


@pytest.mark.parametrize("case", FAMILIES)
def test_generation_past_max_block_size_falls_back_to_the_cropped_window(case):
    model = model_for(case)
    idx = prompt(batch=2, length=7)
    new = BLOCK + 6 - idx.shape[1]  # 6 steps past the window
    lengths = []
    hook = model.blocks[0].register_forward_pre_hook(
        lambda _, args: lengths.append(args[0].shape[1])
    )
    cached, cached_logits = model.generate(idx, new, temperature=0, return_logits=True)
    hook.remove()
    # prefill, one token a step while the context fits, then the cropped window every step
    assert lengths == [7] + [1] * (BLOCK - 7) + [BLOCK] * (new - 1 - (BLOCK - 7))
    uncached, uncached_logits = model.generate(
        idx, new, temperature=0, use_cache=False, return_logits=True
    )
    assert torch.equal(cached, uncached)
    torch.testing.assert_close(cached_logits, uncached_logits, rtol=0, atol=1e-12)
    reference = uncached_step_logits(model, cached, idx.shape[1])
    torch.testing.assert_close(cached_logits, reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_prefill_equals_one_forward(case):
    """Several positions after a cached prefix (relative symbols then read pairwise, the
    recurrent mechanisms fold several positions into their state)."""
    model = model_for(case)
    idx = prompt(batch=2, length=BLOCK)
    with torch.no_grad():
        full = model(idx)[0]
        cache = model.new_cache()
        parts = [model(idx[:, a:b], cache=cache)[0] for a, b in ((0, 4), (4, 5), (5, 12), (12, 20))]
    assert cache.length == BLOCK
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "case", ["standard-rope", "relational-relative", "dual-symbolic", "linear"]
)
def test_float32_cached_logits_within_float32_tolerance(case):
    model = model_for(case, torch.float32)
    idx = prompt()
    cached, logits = model.generate(idx, BLOCK - 5, temperature=0, return_logits=True)
    reference = uncached_step_logits(model, cached, idx.shape[1])
    torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["standard-gqa-rope_half", "relational-symbolic", "additive"])
def test_sampled_generation_is_the_same_with_and_without_the_cache(case):
    model = model_for(case)
    idx = prompt()
    torch.manual_seed(3)
    cached = model.generate(idx, 12, temperature=0.9, top_k=5)
    torch.manual_seed(3)
    uncached = model.generate(idx, 12, temperature=0.9, top_k=5, use_cache=False)
    assert torch.equal(cached, uncached)


def test_prompt_of_one_token_and_zero_new_tokens():
    model = model_for("relational-relative")
    idx = prompt(length=1)
    out, logits = model.generate(idx, 6, temperature=0, return_logits=True)
    torch.testing.assert_close(logits, uncached_step_logits(model, out, 1), rtol=0, atol=1e-12)
    same, none = model.generate(idx, 0, return_logits=True)
    assert torch.equal(same, idx) and none.shape == (3, 0, VOCAB)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (dict(temperature=-1.0), r"temperature=-1\.0: must be a finite number > 0, or 0"),
        (dict(temperature=math.inf), "temperature=inf: must be a finite number"),
        (dict(temperature=math.nan), "temperature=nan: must be a finite number"),
        (dict(max_new_tokens=-2), "max_new_tokens=-2: must be an int >= 0"),
        (dict(max_new_tokens=2.5), "max_new_tokens=2.5: must be an int >= 0"),
        (dict(top_k=0), r"top_k=0: must be None \(every token\) or an int >= 1"),
        (dict(top_k=-3), "top_k=-3: must be None"),
        (dict(idx=prompt(length=0)), r"idx \(3, 0\) has no tokens: the prompt needs T >= 1"),
    ],
)
def test_bad_generation_arguments_are_refused_before_any_compute(change, error):
    model = model_for("standard-rope")

    def refuse(module, args):
        raise AssertionError("the model ran before its arguments were checked")

    model.register_forward_pre_hook(refuse)
    with pytest.raises(ValueError, match=error):
        model.generate(**{"idx": prompt(), "max_new_tokens": 3, **change})


def test_top_k_beyond_the_vocabulary_samples_from_all_of_it():
    model = model_for("standard-rope")
    torch.manual_seed(3)
    every = model.generate(prompt(), 6, top_k=VOCAB + 5)
    torch.manual_seed(3)
    assert torch.equal(every, model.generate(prompt(), 6))


def test_prompt_longer_than_max_block_size_runs_uncached():
    model = model_for("standard-rope")
    idx = prompt(length=BLOCK + 3)
    cached = model.generate(idx, 4, temperature=0)
    assert torch.equal(cached, model.generate(idx, 4, temperature=0, use_cache=False))


def test_mechanisms_without_a_cache_fall_back_silently():
    torch.manual_seed(0)
    model = LanguageModel(
        VOCAB, D, 1, max_block_size=BLOCK, attention="axial", attention_kwargs=dict(n_heads=2,
        n_axes=1),
    ).double().eval()  # fmt: skip
    assert not model.supports_cache()
    idx = prompt()
    assert torch.equal(
        model.generate(idx, 8, temperature=0),
        model.generate(idx, 8, temperature=0, use_cache=False),
    )
    with pytest.raises(ValueError, match="takes no cache"):
        model(idx, cache=model.new_cache())


def test_sigmoid_attention_with_the_papers_bias_generates_without_a_cache():
    """b = -log(n) changes every earlier output as n grows: no cache, generation recomputes."""
    torch.manual_seed(0)
    model = LanguageModel(VOCAB, D, LAYERS, max_block_size=BLOCK, attention="sigmoid",
                          attention_kwargs=dict(n_heads=2)).double().eval()  # fmt: skip
    assert not model.supports_cache()
    idx = prompt()
    out, logits = model.generate(idx, 6, temperature=0, return_logits=True)
    torch.testing.assert_close(logits, uncached_step_logits(model, out, idx.shape[1]))


def test_reference_dense_relative_symbols_are_not_cached():
    model = model_for("relational-relative")
    model.symbol_retriever.returns = "reference"  # dense (N, N, d) symbols, as the reference
    for block in model.blocks:
        block.attn.use_relative_positional_symbols = True  # reads them pairwise
    assert not model.supports_cache()
    idx = prompt()
    assert torch.equal(
        model.generate(idx, 6, temperature=0),
        model.generate(idx, 6, temperature=0, use_cache=False),
    )


def test_cache_is_bounded_by_max_block_size():
    model = model_for("standard-learned")
    cache = model.new_cache()
    with torch.no_grad():
        model(prompt(length=BLOCK - 2), cache=cache)
        with pytest.raises(ValueError, match="exceed max_block_size"):
            model(prompt(length=3), cache=cache)
    assert cache.length == BLOCK - 2


def test_cached_calls_attend_bottom_right(monkeypatch):
    """Calls with a cache pass is_causal="bottom_right" (the new queries are the last)."""
    import attn_zoo.mechanisms.standard as standard

    seen = []
    original = standard.softmax_attention

    def spy(q, k, v, **kwargs):
        seen.append((q.shape[2], k.shape[2], kwargs["is_causal"]))
        return original(q, k, v, **kwargs)

    monkeypatch.setattr(standard, "softmax_attention", spy)
    model = model_for("standard-rope")
    model.generate(prompt(length=4), 3, temperature=0)
    assert seen == [(4, 4, "bottom_right")] * LAYERS + [
        (1, m, "bottom_right") for m in (5, 6) for _ in range(LAYERS)
    ]


def test_caches_hold_what_each_mechanism_needs():
    idx = prompt(batch=2, length=6)
    with torch.no_grad():
        gqa = model_for("standard-gqa-rope_half")
        cache = gqa.new_cache()
        gqa(idx, cache=cache)
        k, v = cache[0].cached("k"), cache[0].cached("v")
        assert k.shape == v.shape == (2, 2, 6, D // 4)  # the kv heads only
        rel = model_for("relational-relative")
        cache = rel.new_cache()
        rel(idx, cache=cache)
        assert cache[0].cached("k").shape[2] == cache[0].cached("kr").shape[2] == 6
        assert cache[0].cached("v") is None  # relative symbols: the table, no values
        sym = model_for("relational-symbolic")
        cache = sym.new_cache()
        sym(idx, cache=cache)
        assert cache[1].cached("v").shape == (2, 2, 6, D // 2)
        dual = model_for("dual-symbolic")
        cache = dual.new_cache()
        dual(idx, cache=cache)
        assert set(cache[0].children) == {"sa", "ra"}
        assert cache[0].children["ra"].cached("kr").shape[2] == 6
        linear = model_for("linear-gqa")
        cache = linear.new_cache()
        linear(idx, cache=cache)
        assert cache[0].state["S"].shape == (2, 2, 6, D // 4)  # (B, Hkv, key_dim, head_dim)
        assert cache[0].state["z"].shape == (2, 2, 6)
        additive = model_for("additive")
        cache = additive.new_cache()
        additive(idx, cache=cache)
        assert [t.shape for t in cache[0].state["query"]] == [(2, 2), (2, 2), (2, 2, D // 2)]
        gla = model_for("gla")
        cache = gla.new_cache()
        gla(idx, cache=cache)
        assert cache[0].state["S"].shape == (2, 2, D // 4, D // 2)  # (B, H, key_dim, head_dim)
        differential = model_for("differential-gqa")
        cache = differential.new_cache()
        differential(idx, cache=cache)
        assert cache[0].cached("k").shape == (2, 4, 6, D // 8)  # both halves of 2 kv heads
        assert cache[0].cached("v").shape == (2, 2, 6, D // 4)


def test_layer_cache_concatenates_and_is_bounded_by_its_capacity():
    layer = LayerCache()
    a, b = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 1, 4)
    (first,) = layer.append(k=a)
    (both,) = layer.append(k=b)
    torch.testing.assert_close(both, torch.cat([a, b], dim=2))
    bounded = LayerCache(capacity=3)
    bounded.append(k=a)
    with pytest.raises(ValueError, match="capacity"):
        bounded.append(k=b)
    assert repr(Cache(2, 5)) == "Cache(layers=2, length=0, capacity=5)"


def test_recurrent_caches_serve_causal_calls_only():
    model = model_for("linear")
    x = torch.randn(1, 3, D, dtype=torch.float64)
    others = (model_for(case).blocks[0].attn for case in ("additive", "gla"))
    for attention in (model.blocks[0].attn, *others):
        with pytest.raises(ValueError, match="causal"):
            attention(x, is_causal=False, cache=LayerCache())


def test_generation_bench_suite_and_report(tmp_path):
    from ablations.bench.report import write_bench_report
    from ablations.bench.suites import bench_generation

    table = bench_generation(lengths=(20, 24), repeats=1, d_model=16, n_layers=1, prompt=4)
    assert list(table.backend.unique()) == [
        "standard:cached",
        "standard:uncached",
        "relational:cached",
        "relational:uncached",
    ]
    assert (table.tokens_per_s > 0).all() and (
        table[table.backend.str.endswith("uncached")].speedup == 1
    ).all()
    write_bench_report({"generation": table}, tmp_path, "t", {"generation": "settings"}, "cmd")
    markdown = (tmp_path / "report.md").read_text()
    assert "## Suite: generation" in markdown and "| 24 | relational:cached |" in markdown
    assert (tmp_path / "tokens_generation.png").exists()
    assert (tmp_path / "bench_generation.csv").read_text().startswith("backend,N,")
