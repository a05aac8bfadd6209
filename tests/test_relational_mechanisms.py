"""Relational and dual attention mechanisms: backends agree, contract holds, errors are clear."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.kernels import UnsupportedCallError
from attn_zoo.kernels.rotary import Rotary, rotary_tables
from attn_zoo.symbols import RelativeSymbols, build_symbol_retriever
from attn_zoo.testing import assert_mechanism_backends_agree

RETRIEVERS = [
    None,
    ("symbolic_attention", dict(n_symbols=5, n_heads=2)),
    ("positional_symbols", dict(max_length=20)),
    ("position_relative", dict(max_rel_pos=3)),
]


@st.composite
def relational_kwargs(draw, n_heads):
    kwargs = dict(
        n_relations=draw(st.integers(1, 4)),
        rel_activation=draw(st.sampled_from(["identity", "relu", "softmax", "tanh"])),
        symmetric_rels=draw(st.booleans()),
        n_kv_heads=draw(st.sampled_from([h for h in (1, n_heads) if n_heads % h == 0])),
        rel_proj_dim=draw(st.one_of(st.none(), st.integers(1, 5))),
        add_bias_kv=draw(st.booleans()),
    )
    retriever = draw(st.sampled_from(RETRIEVERS))
    if retriever is not None:
        kwargs.update(symbol_retrieval=retriever[0], symbol_retrieval_kwargs=retriever[1])
    return kwargs


@given(
    st.integers(1, 3).flatmap(lambda h: st.tuples(st.just(h), relational_kwargs(h))),
    st.integers(1, 20),
    st.booleans(),
    st.integers(0, 999),
)
def test_relational_backends_agree(config, length, is_causal, seed):
    n_heads, kwargs = config
    d_model = 4 * n_heads
    symbols = None
    if "symbol_retrieval" not in kwargs:
        symbols = torch.randn(
            2, length, d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        )
    report = assert_mechanism_backends_agree(
        "relational",
        dict(d_model=d_model, n_heads=n_heads, **kwargs),
        length=length,
        is_causal=is_causal,
        symbols=symbols,
        seed=seed,
    )
    assert report["naive"] == report["chunked"] == "ok"
    fused_fits = (
        kwargs["rel_activation"] == "identity"
        and kwargs.get("symbol_retrieval") != "position_relative"
    )
    assert (report["sdpa"] == "ok") == (report["fused"] == "ok") == fused_fits


@given(
    st.integers(0, 2),
    st.integers(1, 2),
    st.booleans(),
    st.sampled_from(RETRIEVERS[1:]),
    st.integers(1, 12),
    st.integers(0, 999),
)
def test_dual_backends_agree(n_sa, n_ra, share, retriever, length, seed):
    kwargs = dict(
        d_model=4 * (n_sa + n_ra),
        n_heads_sa=n_sa,
        n_heads_ra=n_ra,
        share_attn_params=share and n_sa == n_ra,
        symbol_retrieval=retriever[0],
        symbol_retrieval_kwargs=retriever[1],
    )
    mask = torch.rand(2, 1, length, length, generator=torch.Generator().manual_seed(seed)) < 0.6
    report = assert_mechanism_backends_agree(
        "dual", kwargs, length=length, attn_mask=mask, seed=seed
    )
    assert report["naive"] == report["chunked"] == "ok"


def test_dual_backend_reaches_both_branches():
    """A tier name set on dual attention is set on both branches (the state_dict is the same
    for every backend: tests/test_mechanism_contract.py)."""
    m = az.build("dual", d_model=16, n_heads_sa=2, n_heads_ra=2)
    for backend in az.list_backends("dual"):
        m.backend = backend
        assert m.self_attention.backend == m.relational_attention.backend == backend
    assert az.list_backends("dual") == ["naive", "chunked", "fused"]
    with pytest.raises(ValueError, match="Valid: auto, chunked, fused, naive"):
        m.backend = "sdpa"
    ok, reason = az.backend_status("dual", "fused")
    assert ok and "sdpa" in reason


def test_share_attn_params_ties_the_branches():
    m = az.build("dual", d_model=16, n_heads_sa=2, n_heads_ra=2, share_attn_params=True)
    assert m.self_attention.wq is m.relational_attention.wq_attn
    assert m.self_attention.wk is m.relational_attention.wk_attn


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: az.build(
                "dual", d_model=16, n_heads_sa=2, n_heads_ra=1, share_attn_params=True
            ),
            "share_attn_params needs n_heads_sa == n_heads_ra",
        ),
        (
            lambda: az.build(
                "dual", d_model=16, n_heads_sa=2, n_heads_ra=2, ra_kwargs=dict(n_relation=2)
            ),
            "key of ra_kwargs .mechanism 'relational'.: 'n_relation'. Did you mean 'n_relations'",
        ),
        (
            lambda: az.build("dual", d_model=16, n_heads_sa=0, n_heads_ra=0),
            "need >= 0 each, > 0 in total",
        ),
        (
            lambda: az.build("dual", d_model=16, n_heads_sa=1, n_heads_ra=1, ra_type="rca"),
            "ra_type='rca'",
        ),
        (
            lambda: az.build("relational", d_model=16, n_heads=2, rel_activation="elu"),
            "rel_activation='elu'",
        ),
        (
            lambda: az.build("relational", d_model=16, n_heads=2, symbol_retrieval="symbolic"),
            "Did you mean 'symbolic_attention'",
        ),
        (
            lambda: az.build(
                "relational",
                d_model=16,
                n_heads=2,
                symbol_retrieval="positional_symbols",
                symbol_retrieval_kwargs=dict(max_len=4),
            ),
            "Did you mean 'max_length'",
        ),
        (
            lambda: az.build("relational", d_model=16, n_heads=2)(torch.randn(1, 3, 16)),
            "relational attention needs symbols",
        ),
        (
            lambda: az.build(
                "relational", d_model=16, n_heads=2, use_relative_positional_symbols=True
            )(torch.randn(1, 3, 16), torch.randn(1, 3, 16)),
            r"symbols \(1, 3, 16\): use_relative_positional_symbols=True takes pairwise symbols "
            r"\(N, N, d_model\) = \(3, 3, 16\)",
        ),
        (
            lambda: az.build(
                "relational",
                d_model=16,
                n_heads=2,
                symbol_retrieval="positional_symbols",
                symbol_retrieval_kwargs=dict(max_length=4),
            )(torch.randn(1, 5, 16)),
            "length 5 exceeds max_length=4",
        ),
    ],
)
def test_errors_name_the_value_and_valid_choices(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_relative_symbols_are_never_expanded_by_chunked():
    """Relative symbols: nothing of N x N x hd elements is built on the chunked backend."""
    n, d = 256, 32
    m = az.build(
        "relational",
        backend="chunked",
        d_model=d,
        n_heads=2,
        symbol_retrieval="position_relative",
        symbol_retrieval_kwargs=dict(max_rel_pos=8),
    )
    x = torch.randn(1, n, d)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: sizes.append(t.numel()) or t, lambda t: t
    ):
        m(x, is_causal=True).sum().backward()
    assert max(sizes) < n * n


@given(
    st.integers(1, 3).flatmap(lambda h: st.tuples(st.just(h), relational_kwargs(h))),
    st.integers(1, 12),
    st.sampled_from([False, True, "mask"]),
    st.booleans(),
    st.integers(0, 999),
)
def test_dense_pair_symbols_on_naive_and_chunked(config, length, causal, batched, seed):
    """use_relative_positional_symbols=True with dense pairwise symbols (N, N, d_model), or
    (B, N, N, d_model): naive and chunked agree (output, grads of x and every parameter), the
    fused tier refuses naming pair_symbols."""
    n_heads, kwargs = config
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("symbol_retrieval")}
    d_model = 4 * n_heads
    gen = torch.Generator().manual_seed(seed)
    shape = (2, length, length, d_model) if batched else (length, length, d_model)
    symbols = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = torch.rand(length, length, generator=gen) < 0.6 if causal == "mask" else None
    report = assert_mechanism_backends_agree(
        "relational",
        dict(d_model=d_model, n_heads=n_heads, use_relative_positional_symbols=True, **kwargs),
        length=length,
        is_causal=causal is True,
        attn_mask=mask,
        symbols=symbols,
        seed=seed,
    )
    assert report["naive"] == report["chunked"] == "ok"
    assert "does not support pair_symbols" in report["fused"]
    report = assert_mechanism_backends_agree(
        "dual",
        dict(
            d_model=d_model + 4,
            n_heads_sa=1,
            n_heads_ra=n_heads,
            ra_kwargs=dict(use_relative_positional_symbols=True, **kwargs),
        ),
        length=length,
        is_causal=causal is True,
        attn_mask=mask,
        symbols=torch.randn(*shape[:-1], d_model + 4, generator=gen, dtype=torch.float64),
        seed=seed,
        backends=["naive", "chunked", "auto"],
    )
    assert set(report.values()) == {"ok"}


@pytest.mark.parametrize("backend", ["naive", "chunked"])
def test_dense_symbols_equal_their_relative_form(backend):
    """RelativeSymbols.dense(N) fed as pairwise symbols gives the output and the table
    gradient of the relative form (never expanded)."""
    torch.manual_seed(0)
    m = az.build(
        "relational", backend=backend, d_model=12, n_heads=3, n_kv_heads=1,
        rel_activation="softmax", symbol_retrieval="position_relative",
        symbol_retrieval_kwargs=dict(max_rel_pos=2),
    ).double()  # fmt: skip
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    relative = m.symbol_retriever(x)
    table = relative.table
    want = m(x, relative, is_causal=True)
    (want_grad,) = torch.autograd.grad(want.square().sum(), table)
    got = m(x, relative.dense(7), is_causal=True)
    (got_grad,) = torch.autograd.grad(got.square().sum(), table)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-12, rtol=0)


SYMBOLS_FOR_EMPTY = {  # how the symbols of a (3, 0, 8) input arrive
    "absolute": lambda: dict(symbols=torch.randn(3, 0, 8)),
    "dense": lambda: dict(symbols=torch.randn(0, 0, 8)),
    "symbolic_attention": dict,
    "positional_symbols": dict,
    "position_relative": dict,
}


def empty_sequence_module(mechanism: str, symbols: str, backend: str):
    kwargs = dict(d_model=8, backend=backend)
    if symbols in dict(RETRIEVERS[1:]):
        kwargs.update(
            symbol_retrieval=symbols, symbol_retrieval_kwargs=dict(RETRIEVERS[1:])[symbols]
        )
    relative = dict(use_relative_positional_symbols=symbols == "dense")
    if mechanism == "relational":
        return az.build("relational", n_heads=2, **relative, **kwargs)
    return az.build("dual", n_heads_sa=1, n_heads_ra=1, ra_kwargs=relative, **kwargs)


@pytest.mark.parametrize("mechanism", ["relational", "dual"])
@pytest.mark.parametrize("symbols", sorted(SYMBOLS_FOR_EMPTY))
def test_empty_sequence_gives_empty_output_on_every_backend(mechanism, symbols):
    """N = 0: (B, 0, d_model) with a backward, on every backend and through auto, causal,
    with RoPE, and reference-style returns of empty maps; a backend that cannot serve it
    refuses by its capabilities (cpp: no keys; triton: no CUDA here; the fused tier: no pair or
    relative symbols), nothing crashes."""
    cos, sin = rotary_tables(4, 0)
    served = set()
    for backend in ["auto", *az.list_backends(mechanism)]:
        m = empty_sequence_module(mechanism, symbols, backend)
        x = torch.randn(3, 0, 8, requires_grad=True)
        call = dict(**SYMBOLS_FOR_EMPTY[symbols](), is_causal=True, rope=Rotary(cos, sin))
        try:
            out = m(x, **call)
        except UnsupportedCallError as err:
            why = ("no_keys", "pair_symbols", "relative_symbols", "'cuda'")
            assert any(reason in str(err) for reason in why), err
            continue
        served.add(backend)
        assert out.shape == (3, 0, 8)
        out.sum().backward()
        m.returns = "reference"
        if mechanism == "relational":
            out, attention, relations = m(x, **call)
            assert attention.shape == (3, 2, 0, 0) and relations.shape == (3, 0, 0, 2)
        else:
            out, sa, (attention, relations) = m(x, **call, need_weights=True)
            assert sa.shape == attention.shape == (3, 1, 0, 0) and relations.shape == (3, 0, 0, 1)
        assert out.shape == (3, 0, 8)
    fused = set() if symbols in ("dense", "position_relative") else {"fused"}  # no v_pair, v_rel
    assert served >= {"auto", "naive", "chunked"} | fused


@pytest.mark.parametrize("mechanism", ["relational", "dual"])
@pytest.mark.parametrize(
    ("relative", "symbols", "shape"),
    [
        (False, lambda: torch.randn(2, 5, 15), r"symbols \(2, 5, 15\)"),
        (True, lambda: torch.randn(5, 5, 17), r"symbols \(5, 5, 17\)"),
        (True, lambda: torch.randn(2, 5, 5, 4), r"symbols \(2, 5, 5, 4\)"),
        (
            False,
            lambda: RelativeSymbols(torch.randn(5, 8), 2),
            r"symbols.table \(5, 8\)",
        ),
    ],
)
def test_symbols_of_the_wrong_width_are_named(mechanism, relative, symbols, shape):
    """A ValueError naming symbols and the width d_model, before any projection runs (not
    torch's matmul error)."""
    ra = dict(use_relative_positional_symbols=relative)
    if mechanism == "relational":
        m = az.build("relational", d_model=16, n_heads=2, **ra)
    else:
        m = az.build("dual", d_model=16, n_heads_sa=1, n_heads_ra=1, ra_kwargs=ra)
    with pytest.raises(ValueError, match=shape + ": the last dimension must be d_model=16"):
        m(torch.randn(2, 5, 16), symbols())


@pytest.mark.parametrize("backend", ["naive", "chunked", "fused"])
def test_native_reference_returns_are_the_pass_maps(backend):
    """returns="reference" on a native module: the output is unchanged and the maps are those
    attention_maps materialises for the same call (relations as (B, N, N, R))."""
    torch.manual_seed(0)
    m = az.build("relational", backend=backend, d_model=12, n_heads=3, n_relations=2)
    x, s = torch.randn(2, 6, 12), torch.randn(2, 6, 12)
    mask = torch.rand(6, 6) < 0.7
    want = m(x, s, attn_mask=mask)
    maps = m.attention_maps(x, s, attn_mask=mask)
    m.returns = "reference"
    out, attention, relations = m(x, s, attn_mask=mask)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(attention, maps["attention"])
    torch.testing.assert_close(relations, maps["relations"].permute(0, 2, 3, 1))
    dual = az.build("dual", backend=backend, d_model=12, n_heads_sa=2, n_heads_ra=1)
    dual.returns = "reference"
    assert dual.relational_attention.returns == "reference"
    out, sa, (attention, relations) = dual(x, s)
    assert sa is None and attention.shape == (2, 1, 6, 6) and relations.shape == (2, 6, 6, 1)
    out, sa, _ = dual(x, s, need_weights=True)
    torch.testing.assert_close(sa, dual.self_attention.attention_maps(x)["attention"])


def test_returns_accepts_output_or_reference():
    for m in (
        az.build("relational", d_model=8, n_heads=2),
        az.build("dual", d_model=8, n_heads_sa=1, n_heads_ra=1),
        build_symbol_retriever("position_relative", 8, max_rel_pos=2),
    ):
        with pytest.raises(ValueError, match="returns='tuple': valid are 'output', 'reference'"):
            m.returns = "tuple"
