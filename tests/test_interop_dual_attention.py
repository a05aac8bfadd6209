"""Ported modules give the `dual-attention` reference's outputs and gradients, float64, 1e-10,
on every backend that accepts the configuration."""

import pytest
import torch
from dual_attention import symbol_retrieval as ref_symbols
from dual_attention.attention_utils import precompute_freqs_cis
from dual_attention.dual_attention import DualAttention as RefDual
from dual_attention.relational_attention import RelationalAttention as RefRelational
from hypothesis import given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.interop.dual_attention import convert_state_dict, port
from attn_zoo.kernels import UnsupportedCallError
from attn_zoo.kernels.rotary import Rotary, rotary_tables

ATOL = 1e-10
ACTIVATIONS = ["identity", "relu", "sigmoid", "tanh", "gelu", "silu", "softmax"]


@st.composite
def ra_configs(draw, total_heads: int, n_heads: int):
    """RelationalAttention kwargs the reference accepts (rel_proj_dim * R == head_dim * H)."""
    head_dim = draw(st.sampled_from([2, 4]))
    d_model = total_heads * head_dim
    n_rel = draw(st.sampled_from([r for r in (1, 2, 3, 4, 6, 8) if (head_dim * n_heads) % r == 0]))
    kwargs = dict(
        n_relations=n_rel,
        rel_activation=draw(st.sampled_from(ACTIVATIONS)),
        symmetric_rels=draw(st.booleans()),
        n_kv_heads=draw(st.sampled_from([h for h in (1, 2, n_heads) if n_heads % h == 0])),
        add_bias_kv=draw(st.booleans()),
        add_bias_out=draw(st.booleans()),
    )
    if draw(st.booleans()):
        kwargs["rel_proj_dim"] = head_dim * n_heads // n_rel
    if draw(st.booleans()):
        kwargs["key_dim"] = draw(st.sampled_from([2, 6]))
    return d_model, kwargs


@st.composite
def calls(draw, length_max=9):
    """(length, attn_mask or None, is_causal, use RoPE, relative symbols K or None, seed)."""
    length = draw(st.integers(1, length_max))
    masking = draw(st.sampled_from(["none", "causal", "mask"]))
    return dict(
        length=length,
        masking=masking,
        rope=draw(st.booleans()),
        max_rel_pos=draw(st.one_of(st.none(), st.integers(0, 4))),
        seed=draw(st.integers(0, 2**20)),
    )


def make_inputs(call, d_model, key_dim):
    gen = torch.Generator().manual_seed(call["seed"])
    n = call["length"]
    x = torch.randn(2, n, d_model, generator=gen, dtype=torch.float64)
    mask = None
    if call["masking"] == "mask":
        mask = (torch.rand(n, n, generator=gen) < 0.6) | torch.eye(
            n, dtype=torch.bool
        )  # no empty row
    ref_kw = dict(attn_mask=mask, is_causal=call["masking"] == "causal")
    our_kw = dict(ref_kw)
    if call["rope"] and key_dim % 2 == 0:
        cos, sin = precompute_freqs_cis(key_dim, n)
        ref_kw.update(freqs_cos=cos, freqs_sin=sin)
        our_cos, our_sin = rotary_tables(key_dim, n)
        our_kw["rope"] = Rotary(our_cos, our_sin)
    return x, ref_kw, our_kw


def symbols_pair(call, d_model, x):
    """(reference symbols, our symbols): absolute from a random tensor, or relative."""
    if call["max_rel_pos"] is None:
        s = torch.randn(
            x.shape, generator=torch.Generator().manual_seed(call["seed"] + 1), dtype=torch.float64
        )
        return s, s
    ref = ref_symbols.PositionRelativeSymbolRetriever(d_model, call["max_rel_pos"]).double()
    return ref(x), port(ref)(x)


def grads(out, x, symbols, module):
    inputs = [x] + (
        [symbols] if torch.is_tensor(symbols) and symbols.is_leaf and symbols.requires_grad else []
    )
    params = dict(module.named_parameters())
    got = torch.autograd.grad(
        out, inputs + list(params.values()), torch.ones_like(out), allow_unused=True
    )
    named = {"x": got[0], **({"symbols": got[1]} if len(inputs) > 1 else {})}
    named.update({k: g for k, g in zip(params, got[len(inputs) :], strict=True) if g is not None})
    return named


def run_ported(module, x, symbols, kw, relative, reference_output):
    """Output and grads (x, absolute symbols, parameters); reference modules return tuples."""
    x_ = x.clone().requires_grad_(True)
    s_ = symbols if relative else symbols.detach().clone().requires_grad_(True)
    out = module(x_, s_, **kw)
    out = out[0] if reference_output else out
    return {"output": out, **grads(out, x_, s_, module)}


def assert_ported_agrees(reference, ours, run_ref, run_ours, backends):
    """Outputs and grads of ours on each backend vs the reference; returns backends run."""
    want = run_ref(reference)
    ran = []
    for backend in backends:
        ours.backend = backend
        try:
            got = run_ours(ours)
        except UnsupportedCallError:
            continue
        ran.append(backend)
        assert set(got) == set(want), set(got) ^ set(want)
        for key in want:
            torch.testing.assert_close(
                got[key],
                want[key],
                atol=ATOL,
                rtol=0,
                msg=lambda m, k=key, b=backend: f"{b} {k}: {m}",
            )
    assert "naive" in ran and "chunked" in ran
    return ran


@given(st.integers(1, 3).flatmap(lambda h: st.tuples(st.just(h), ra_configs(h, h))), calls())
def test_relational_attention_matches_reference(config, call):
    n_heads, (d_model, kwargs) = config
    kwargs["use_relative_positional_symbols"] = call["max_rel_pos"] is not None
    torch.manual_seed(call["seed"])
    reference = RefRelational(d_model, n_heads, **kwargs).double()
    ours = port(reference)
    x, ref_kw, our_kw = make_inputs(call, d_model, reference.key_dim)
    ref_s, our_s = symbols_pair(call, d_model, x)

    relative = call["max_rel_pos"] is not None
    assert_ported_agrees(
        reference, ours,
        lambda m: run_ported(m, x, ref_s, ref_kw, relative, reference_output=True),
        lambda m: run_ported(m, x, our_s, our_kw, relative, reference_output=False),
        ["naive", "chunked", "fused"],
    )  # fmt: skip


@given(st.integers(1, 2), st.integers(1, 2), st.booleans(), st.data(), calls())
def test_dual_attention_matches_reference(n_sa, n_ra, share, data, call):
    share = share and n_sa == n_ra
    d_model, ra_kwargs = data.draw(ra_configs(n_sa + n_ra, n_ra))
    ra_kwargs.pop("key_dim", None)  # RoPE and share_attn_params need equal key widths
    ra_kwargs["use_relative_positional_symbols"] = call["max_rel_pos"] is not None
    sa_kwargs = dict(n_kv_heads=data.draw(st.sampled_from([h for h in (1, n_sa) if n_sa % h == 0])))
    if share:
        sa_kwargs["n_kv_heads"] = ra_kwargs["n_kv_heads"]
    torch.manual_seed(call["seed"])
    reference = RefDual(
        d_model,
        n_sa,
        n_ra,
        dropout=0.0,
        sa_kwargs=sa_kwargs,
        ra_kwargs=ra_kwargs,
        share_attn_params=share,
    ).double()
    ours = port(reference)
    x, ref_kw, our_kw = make_inputs(call, d_model, d_model // (n_sa + n_ra))
    ref_s, our_s = symbols_pair(call, d_model, x)

    relative = call["max_rel_pos"] is not None
    assert_ported_agrees(
        reference, ours,
        lambda m: run_ported(m, x, ref_s, ref_kw, relative, reference_output=True),
        lambda m: run_ported(m, x, our_s, our_kw, relative, reference_output=False),
        ["naive", "chunked", "fused"],
    )  # fmt: skip


@pytest.mark.parametrize(
    "reference",
    [
        lambda: ref_symbols.SymbolicAttention(d_model=12, n_heads=3, n_symbols=5),
        lambda: ref_symbols.PositionalSymbolRetriever(symbol_dim=12, max_length=9),
    ],
)
def test_symbol_retrievers_match_reference(reference):
    torch.manual_seed(0)
    ref = reference().double()
    ours = port(ref)
    x = torch.randn(2, 7, 12, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
    (g_ref,) = torch.autograd.grad(
        ref(x).square().sum(), x, allow_unused=True, materialize_grads=True
    )
    (g_ours,) = torch.autograd.grad(
        ours(x).square().sum(), x, allow_unused=True, materialize_grads=True
    )
    torch.testing.assert_close(g_ours, g_ref, atol=ATOL, rtol=0)


def test_relative_retriever_matches_reference_when_expanded():
    ref = ref_symbols.PositionRelativeSymbolRetriever(symbol_dim=6, max_rel_pos=2).double()
    ours = port(ref)(torch.zeros(1, 5, 6))
    index = (torch.arange(5)[None] - torch.arange(5)[:, None]).clamp(-2, 2) + 2
    torch.testing.assert_close(ours.table[index], ref(torch.zeros(1, 5, 6)))


def test_fully_masked_row_zeros_here_nan_in_reference():
    """The one deliberate difference: documented in attn_zoo.interop.dual_attention."""
    torch.manual_seed(0)
    reference = RefRelational(8, 2, add_bias_out=False).double()
    ours = port(reference)
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False
    want = reference(x, x, attn_mask=mask)[0]
    for backend in ("naive", "chunked", "fused"):
        ours.backend = backend
        got = ours(x, x, attn_mask=mask)
        assert want[0, 1].isnan().all() and torch.equal(
            got[0, 1], torch.zeros(8, dtype=torch.float64)
        )
        torch.testing.assert_close(got[0, [0, 2, 3]], want[0, [0, 2, 3]], atol=ATOL, rtol=0)


def test_convert_state_dict_drops_the_compile_prefix():
    reference = RefRelational(8, 2)
    compiled_keys = {f"_orig_mod.{k}": v for k, v in reference.state_dict().items()}
    ours = az.build("relational", d_model=8, n_heads=2)
    ours.load_state_dict(convert_state_dict(compiled_keys))
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in reference.state_dict().items())


def test_port_refuses_other_modules():
    with pytest.raises(
        ValueError, match="unknown dual_attention class .*Valid: Attention, DecoderBlock"
    ):
        port(torch.nn.Linear(2, 2))


def dense_symbols(call, d_model: int, batch: int | None = None) -> torch.Tensor:
    """Arbitrary pairwise symbols s_ij (not only position-relative ones): (N, N, d_model)."""
    n = call["length"]
    shape = (n, n, d_model) if batch is None else (batch, n, n, d_model)
    gen = torch.Generator().manual_seed(call["seed"] + 2)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def assert_fused_refuses_pairs(ran):
    assert "fused" not in ran  # cpp, sdpa and triton do not declare pair_symbols


@given(st.integers(1, 3).flatmap(lambda h: st.tuples(st.just(h), ra_configs(h, h))), calls())
def test_relational_dense_relative_symbols_match_reference(config, call):
    """The reference's calling form of use_relative_positional_symbols=True, a dense
    (N, N, d_model) tensor: outputs and gradients (x, the symbols, every parameter) on naive
    and chunked."""
    n_heads, (d_model, kwargs) = config
    kwargs["use_relative_positional_symbols"] = True
    torch.manual_seed(call["seed"])
    reference = RefRelational(d_model, n_heads, **kwargs).double()
    ours = port(reference)
    x, ref_kw, our_kw = make_inputs(call, d_model, reference.key_dim)
    s = dense_symbols(call, d_model)
    ran = assert_ported_agrees(
        reference, ours,
        lambda m: run_ported(m, x, s, ref_kw, False, reference_output=True),
        lambda m: run_ported(m, x, s, our_kw, False, reference_output=False),
        ["naive", "chunked", "fused"],
    )  # fmt: skip
    assert_fused_refuses_pairs(ran)


@given(st.integers(1, 2), st.integers(1, 2), st.booleans(), st.data(), calls())
def test_dual_dense_relative_symbols_match_reference(n_sa, n_ra, share, data, call):
    share = share and n_sa == n_ra
    d_model, ra_kwargs = data.draw(ra_configs(n_sa + n_ra, n_ra))
    ra_kwargs.pop("key_dim", None)  # RoPE and share_attn_params need equal key widths
    ra_kwargs["use_relative_positional_symbols"] = True
    sa_kwargs = dict(n_kv_heads=1 if share is False else ra_kwargs["n_kv_heads"])
    torch.manual_seed(call["seed"])
    reference = RefDual(
        d_model, n_sa, n_ra, dropout=0.0, sa_kwargs=sa_kwargs, ra_kwargs=ra_kwargs,
        share_attn_params=share,
    ).double()  # fmt: skip
    ours = port(reference)
    x, ref_kw, our_kw = make_inputs(call, d_model, d_model // (n_sa + n_ra))
    s = dense_symbols(call, d_model)
    ran = assert_ported_agrees(
        reference, ours,
        lambda m: run_ported(m, x, s, ref_kw, False, reference_output=True),
        lambda m: run_ported(m, x, s, our_kw, False, reference_output=False),
        ["naive", "chunked", "fused"],
    )  # fmt: skip
    assert_fused_refuses_pairs(ran)


def flatten_returns(value, path="returns"):
    """{path: tensor or None} of a nested tuple/list of returns, with its structure."""
    if isinstance(value, tuple | list):
        items = {f"{path} is {type(value).__name__} of {len(value)}": None}
        for i, item in enumerate(value):
            items.update(flatten_returns(item, f"{path}[{i}]"))
        return items
    return {path: value}


def reference_style_run(module, x, symbols, kw, seed, **call):
    """Every returned tensor, and the gradients (x, symbols, parameters) of a random
    combination of all of them: the attention scores and relations must be the pass's own."""
    x_ = x.clone().requires_grad_(True)
    s_ = symbols.detach().clone().requires_grad_(True)
    returned = flatten_returns(module(x_, s_, **kw, **call))
    tensors = [t for t in returned.values() if t is not None]
    gen = torch.Generator().manual_seed(seed)
    total = sum((t * torch.randn(t.shape, generator=gen, dtype=t.dtype)).sum() for t in tensors)
    params = dict(module.named_parameters())
    got = torch.autograd.grad(total, [x_, s_, *params.values()], allow_unused=True)
    grads = {"grad x": got[0], "grad symbols": got[1]}
    grads.update({f"grad {k}": g for k, g in zip(params, got[2:], strict=True) if g is not None})
    return {**returned, **grads}


def assert_same_returns(want: dict, got: dict, backend: str):
    assert set(got) == set(want), set(got) ^ set(want)
    for key, ref in want.items():
        if ref is None:
            assert got[key] is None, f"{backend} {key}: {got[key]!r}, reference None"
            continue
        torch.testing.assert_close(
            got[key], ref, atol=ATOL, rtol=0, msg=lambda m, k=key: f"{backend} {k}: {m}"
        )


@given(
    st.integers(1, 3).flatmap(lambda h: st.tuples(st.just(h), ra_configs(h, h))),
    calls(),
    st.booleans(),
)
def test_relational_reference_returns(config, call, dense):
    """port(..., returns="reference"): (output, attention scores (B, H, N, N), relations
    (B, N, N, R)) equal to the reference's, and so are the gradients through all three, on
    every backend serving the call."""
    n_heads, (d_model, kwargs) = config
    kwargs["use_relative_positional_symbols"] = dense
    torch.manual_seed(call["seed"])
    reference = RefRelational(d_model, n_heads, **kwargs).double()
    x, ref_kw, our_kw = make_inputs(call, d_model, reference.key_dim)
    s = dense_symbols(call, d_model) if dense else torch.randn_like(x)
    want = reference_style_run(reference, x, s, ref_kw, call["seed"])
    ran = []
    for backend in ("naive", "chunked", "fused"):
        ours = port(reference, backend=backend, returns="reference")
        try:
            got = reference_style_run(ours, x, s, our_kw, call["seed"])
        except UnsupportedCallError:
            continue
        ran.append(backend)
        assert_same_returns(want, got, backend)
    assert {"naive", "chunked"} <= set(ran)


@given(st.integers(0, 2), st.integers(0, 2), st.booleans(), st.booleans(), st.data(), calls())
def test_dual_reference_returns(n_sa, n_ra, need_weights, dense, data, call):
    """(output, self-attention weights or None, [attention, relations] or None), as the
    reference returns them, need_weights or not, either branch absent; gradients too."""
    if n_sa + n_ra == 0:
        n_ra = 1
    d_model, ra_kwargs = data.draw(ra_configs(n_sa + n_ra, max(n_ra, 1)))
    ra_kwargs.pop("key_dim", None)
    ra_kwargs["use_relative_positional_symbols"] = dense
    torch.manual_seed(call["seed"])
    reference = RefDual(d_model, n_sa, n_ra, dropout=0.0, ra_kwargs=ra_kwargs).double()
    x, ref_kw, our_kw = make_inputs(call, d_model, d_model // (n_sa + n_ra))
    s = dense_symbols(call, d_model) if dense else torch.randn_like(x)
    want = reference_style_run(reference, x, s, ref_kw, call["seed"], need_weights=need_weights)
    for backend in ("naive", "chunked"):
        ours = port(reference, backend=backend, returns="reference")
        got = reference_style_run(ours, x, s, our_kw, call["seed"], need_weights=need_weights)
        assert_same_returns(want, got, backend)


@pytest.mark.parametrize("backend", ["naive", "chunked"])
@pytest.mark.parametrize("dense", [False, True])
def test_reference_returns_in_training_with_dropout_are_the_pass_itself(backend, dense):
    """With dropout acting, the returned attention is after dropout and the output is made
    from it: under the same seed the ported modules reproduce the reference's pass exactly
    (same random draws in the same order)."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    s = torch.randn(6, 6, 12, dtype=torch.float64) if dense else torch.randn_like(x)
    relative = dict(use_relative_positional_symbols=dense)
    references = [
        (RefRelational(12, 3, n_relations=2, n_kv_heads=1, dropout=0.3, **relative), {}),
        (RefDual(12, 1, 2, 0.3, ra_kwargs=dict(n_relations=4, **relative)), {"need_weights": True}),
    ]
    for reference, call in references:
        reference = reference.double().train()
        ours = port(reference, backend=backend, returns="reference")
        assert ours.training
        torch.manual_seed(7)
        want = reference_style_run(reference, x, s, dict(is_causal=True), 1, **call)
        torch.manual_seed(7)
        got = reference_style_run(ours, x, s, dict(is_causal=True), 1, **call)
        assert_same_returns(want, got, backend)
        attention = next(v for k, v in got.items() if k.endswith("[1]") and v is not None)
        assert (attention == 0).any() and (attention.sum(-1) > 1 + 1e-6).any()  # dropped out


def test_reference_returns_of_attention_and_relative_symbols():
    """Attention returns (output, None); the relative retriever the dense (N, N, d) symbols,
    so reference-style code runs end to end on ported modules."""
    torch.manual_seed(0)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    from dual_attention.attention import Attention as RefAttention

    attention = RefAttention(12, 3, dropout=0.0, n_kv_heads=1).double()
    out, scores = port(attention, returns="reference")(x, is_causal=True)
    want, want_scores = attention(x, x, x, is_causal=True)
    assert scores is None and want_scores is None
    torch.testing.assert_close(out, want, atol=ATOL, rtol=0)

    retriever = ref_symbols.PositionRelativeSymbolRetriever(12, 2).double()
    relational = RefRelational(12, 3, use_relative_positional_symbols=True).double()
    ours_retriever = port(retriever, returns="reference")
    ours_relational = port(relational, returns="reference")
    assert torch.equal(ours_retriever(x), retriever(x))
    out, *maps = ours_relational(x, ours_retriever(x), is_causal=True)
    want, *want_maps = relational(x, retriever(x), is_causal=True)
    for got_t, want_t in zip([out, *maps], [want, *want_maps], strict=True):
        torch.testing.assert_close(got_t, want_t, atol=ATOL, rtol=0)
    assert isinstance(port(retriever)(x), az.symbols.RelativeSymbols)  # default: never dense


def test_returns_is_checked():
    with pytest.raises(ValueError, match="returns='tuple': valid are 'output', 'reference'"):
        port(RefRelational(8, 2), returns="tuple")
