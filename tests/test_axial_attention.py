"""Axial attention: every softmax backend against the float64 naive reference (outputs and
gradients), agreement with the `axial-attention` package on ported weights, causal masking
along every axis, clear errors."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.interop.axial_attention import convert_state_dict, port
from attn_zoo.testing import assert_mechanism_backends_agree, lengths

axial_attention = pytest.importorskip("axial_attention")


@st.composite
def axial_configs(draw):
    """(kwargs, input shape): 1-3 axes of lengths 1-6 (edges first), the embedding anywhere."""
    n_axes = draw(st.integers(1, 3))
    n_heads = draw(st.integers(1, 2))
    d_model = 4 * n_heads
    rank = n_axes + 2
    dim_index = draw(st.sampled_from([*range(1, rank), *range(-rank + 1, 0)]))
    axes = draw(st.lists(lengths(6), min_size=n_axes, max_size=n_axes))
    shape = [draw(st.integers(1, 2)), *axes]
    shape.insert(dim_index % rank, d_model)
    kwargs = dict(
        d_model=d_model,
        n_heads=n_heads,
        n_axes=n_axes,
        head_dim=draw(st.sampled_from([None, 3])),
        dim_index=dim_index,
        combine=draw(st.sampled_from(["sum", "sequential"])),
    )
    return kwargs, tuple(shape)


@given(axial_configs(), st.booleans(), st.integers(0, 999))
def test_backends_agree(config, is_causal, seed):
    kwargs, shape = config
    report = assert_mechanism_backends_agree(
        "axial", kwargs, shape=shape, is_causal=is_causal, seed=seed
    )
    assert {report[b] for b in ("naive", "chunked", "sdpa", "fused")} == {"ok"}
    assert "FlexAttention's CPU path gives wrong results" in report["flex"]
    assert "no CPU kernels" in report["xformers"]


REFERENCE_CONFIGS = [
    (dict(dim=16, num_dimensions=2, heads=4), (2, 5, 7, 16)),
    (dict(dim=16, num_dimensions=2, heads=4, dim_index=1, sum_axial_out=False), (2, 16, 6, 3)),
    (dict(dim=12, num_dimensions=3, heads=3, dim_heads=5, dim_index=2), (1, 3, 12, 4, 5)),
    (dict(dim=8, num_dimensions=1, heads=2, sum_axial_out=False), (3, 9, 8)),
    (dict(dim=8, num_dimensions=3, heads=1, dim_index=-3, sum_axial_out=False), (2, 2, 8, 3, 1)),
]


@pytest.mark.parametrize(("config", "shape"), REFERENCE_CONFIGS)
def test_matches_the_axial_attention_package_on_ported_weights(config, shape):
    torch.manual_seed(0)
    reference = axial_attention.AxialAttention(**config).double()
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    want = reference(x)
    (want_grad,) = torch.autograd.grad(want.square().sum(), x)
    ours = port(reference)
    assert ours.combine == ("sum" if config.get("sum_axial_out", True) else "sequential")
    for backend in ("naive", "chunked", "sdpa"):
        ours.backend = backend
        got = ours(x)
        (grad,) = torch.autograd.grad(got.square().sum(), x)
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
        torch.testing.assert_close(grad, want_grad, atol=1e-10, rtol=0)


def test_ported_float32_module_and_converted_checkpoint():
    torch.manual_seed(1)
    reference = axial_attention.AxialAttention(dim=8, heads=2, dim_index=1).eval()
    x = torch.randn(2, 8, 5, 6)
    ours = port(reference, backend="chunked")
    assert ours.backend == "chunked" and not ours.training
    torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=1e-4)
    fresh = az.build("axial", d_model=8, n_heads=2, dim_index=1)
    fresh.load_state_dict(convert_state_dict(reference.state_dict()))
    torch.testing.assert_close(fresh(x), reference(x), atol=1e-5, rtol=1e-4)


def test_port_rejects_other_classes():
    with pytest.raises(ValueError, match="axial_attention class"):
        port(axial_attention.AxialPositionalEmbedding(8, (4, 4)))
    with pytest.raises(ValueError, match="unexpected key 'pos'"):
        convert_state_dict({"pos": torch.zeros(1)})


@pytest.mark.parametrize("combine", ["sum", "sequential"])
@pytest.mark.parametrize("backend", ["naive", "chunked", "sdpa"])
def test_causal_masks_every_axis(combine, backend):
    """Causal along each axis: later rows never change earlier rows' outputs, nor later
    columns earlier columns' (so the raster order is autoregressive)."""
    torch.manual_seed(0)
    m = az.build("axial", backend=backend, d_model=8, n_heads=2, combine=combine)
    x = torch.randn(2, 6, 7, 8)
    later_rows, later_cols = x.clone(), x.clone()
    later_rows[:, 4:] = torch.randn(2, 2, 7, 8)
    later_cols[:, :, 5:] = torch.randn(2, 6, 2, 8)
    out = m(x, is_causal=True)
    torch.testing.assert_close(m(later_rows, is_causal=True)[:, :4], out[:, :4])
    torch.testing.assert_close(m(later_cols, is_causal=True)[:, :, :5], out[:, :, :5])
    assert not torch.allclose(m(later_rows)[:, :4], m(x)[:, :4])  # without: rows mix


def test_one_axis_is_standard_attention_along_it():
    """With one axis, axial attention is multi-head self-attention over that axis."""
    torch.manual_seed(0)
    axial = az.build("axial", d_model=8, n_heads=2, n_axes=1).double()
    standard = az.build("standard", d_model=8, n_heads=2, add_bias_out=True).double()
    standard.load_state_dict({k.removeprefix("axes.0."): v for k, v in axial.state_dict().items()})
    x = torch.randn(3, 10, 8, dtype=torch.float64)
    torch.testing.assert_close(axial(x, is_causal=True), standard(x, is_causal=True))


def test_state_dict_has_the_projections_of_every_axis():
    """wq, wk, wv, wo (with its bias) per axis; head_dim sets their inner width. (The same
    for every backend: tests/test_mechanism_contract.py.)"""
    m = az.build("axial", d_model=8, n_heads=2, n_axes=3, head_dim=3)
    keys = {k: v.shape for k, v in m.state_dict().items()}
    assert len(keys) == 3 * 5 and keys["axes.2.wo.weight"] == (8, 6)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: az.build("axial", d_model=8, n_heads=3), "n_heads=3: must be >= 1 and divide"),
        (lambda: az.build("axial", d_model=8, n_heads=2, n_axes=0), "n_axes=0"),
        (lambda: az.build("axial", d_model=8, n_heads=2, dim_index=0), "dim_index=0.*batch"),
        (lambda: az.build("axial", d_model=8, n_heads=2, dim_index=4), r"in 1\.\.3 or -3\.\.-1"),
        (
            lambda: az.build("axial", d_model=8, n_heads=2, combine="product"),
            "combine='product': valid are",
        ),
        (
            lambda: az.build("axial", d_model=8, n_heads=2)(torch.randn(2, 3, 8)),
            r"expected 4-D \(batch, 2 axes, embedding\)",
        ),
        (
            lambda: az.build("axial", d_model=8, n_heads=2)(torch.randn(2, 3, 3, 6)),
            "d_model=8 at dim_index=3",
        ),
    ],
)
def test_errors_name_the_option_and_what_is_valid(call, match):
    with pytest.raises(ValueError, match=match):
        call()
