"""Relational and dual attention mechanisms: backends agree, contract holds, errors are clear."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.kernels.rotary import Rotary, rotary_tables
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


@pytest.mark.parametrize("backend", ["naive", "chunked", "fused"])
def test_dual_causal_output_ignores_future_tokens(backend):
    torch.manual_seed(0)
    m = az.build(
        "dual",
        backend=backend,
        d_model=16,
        n_heads_sa=2,
        n_heads_ra=2,
        symbol_retrieval="positional_symbols",
        symbol_retrieval_kwargs=dict(max_length=12),
    )
    cos, sin = rotary_tables(4, 10)
    x = torch.randn(2, 10, 16)
    changed = x.clone()
    changed[:, 6:] = torch.randn(2, 4, 16)
    run = lambda t: m(t, is_causal=True, rope=Rotary(cos, sin))  # noqa: E731
    torch.testing.assert_close(run(x)[:, :6], run(changed)[:, :6])


def test_dual_backend_reaches_both_branches_and_keeps_state_dict():
    m = az.build("dual", d_model=16, n_heads_sa=2, n_heads_ra=2)
    keys = {k: v.shape for k, v in m.state_dict().items()}
    for backend in az.list_backends("dual"):
        m.backend = backend
        assert m.self_attention.backend == m.relational_attention.backend == backend
        assert {k: v.shape for k, v in m.state_dict().items()} == keys
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
            "symbols are absolute but use_relative_positional_symbols=True",
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


def test_relational_trains_a_few_steps():
    torch.manual_seed(0)
    m = az.build(
        "dual",
        backend="chunked",
        d_model=16,
        n_heads_sa=2,
        n_heads_ra=2,
        symbol_retrieval="symbolic_attention",
        symbol_retrieval_kwargs=dict(n_symbols=4, n_heads=2),
    )
    x, target = torch.randn(8, 10, 16), torch.randn(8, 10, 16)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = (m(x, is_causal=True) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
