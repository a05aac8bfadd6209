"""The public registry contract: list, build, status, backend switching, errors."""

import pytest
import torch
from hypothesis import given

import attn_zoo as az
from attn_zoo.kernels.dispatch import Capabilities
from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.kernels.softmax.family import FEATURES
from attn_zoo.kernels.softmax.naive import naive
from attn_zoo.mechanisms.standard import StandardAttention
from attn_zoo.testing import (
    assert_backends_agree,
    assert_mechanism_backends_agree,
    attention_problems,
)


def test_lists():
    assert "standard" in az.list_mechanisms()
    assert az.list_mechanisms() == sorted(az.list_mechanisms())
    assert set(az.list_backends("standard")) >= {
        "naive",
        "chunked",
        "fused",
        "sdpa",
        "flex",
        "xformers",
    }


def test_backend_status():
    assert az.backend_status("standard", "sdpa", device="cpu")[0]
    ok, reason = az.backend_status("standard", "xformers", device="cpu")
    assert not ok and "no CPU kernels" in reason
    ok, reason = az.backend_status("standard", "flex", device="cpu")
    assert not ok and "FlexAttention's CPU path gives wrong results" in reason
    ok, reason = az.backend_status("standard", "fused", device="cpu")
    assert ok and "sdpa" in reason


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: az.build("standrd", d_model=8, n_heads=2),
            "mechanism: 'standrd'. Did you mean 'standard'",
        ),
        (
            lambda: az.build("standard", d_model=8, n_heads=2, n_head=2),
            "'n_head'. Did you mean 'n_heads'",
        ),
        (
            lambda: az.build("standard", backend="chunky", d_model=8, n_heads=2),
            "Did you mean 'chunked'",
        ),
        (lambda: az.list_backends("relationl"), "unknown mechanism"),
        (lambda: az.backend_status("standard", "triton"), "unknown backend"),
        (lambda: az.build("standard", d_model=10, n_heads=4), "d_model=10 must be divisible"),
        (
            lambda: az.build("standard", d_model=8, n_heads=4, n_kv_heads=3),
            "n_kv_heads=3 must divide",
        ),
    ],
)
def test_errors_name_the_value_and_valid_choices(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_backend_is_settable_and_keeps_parameters():
    m = az.build("standard", d_model=16, n_heads=4)
    x = torch.randn(2, 7, 16)
    before = m(x, is_causal=True)
    keys = {k: v.shape for k, v in m.state_dict().items()}
    for backend in ("naive", "chunked", "sdpa", "fused"):
        m.backend = backend
        torch.testing.assert_close(m(x, is_causal=True), before, atol=1e-5, rtol=1e-4)
        assert {k: v.shape for k, v in m.state_dict().items()} == keys
    with pytest.raises(ValueError, match="Valid: auto, chunked"):
        m.backend = "fast"
    assert m.backend == "fused"


def test_state_dict_identical_whatever_the_backend():
    shapes = [
        {
            k: v.shape
            for k, v in az.build("standard", backend=b, d_model=16, n_heads=4, n_kv_heads=2)
            .state_dict()
            .items()
        }
        for b in az.list_backends("standard")
    ]
    assert all(s == shapes[0] for s in shapes)


def test_set_backend_reaches_every_mechanism_or_none():
    model = torch.nn.Sequential(
        az.build("standard", d_model=8, n_heads=2),
        torch.nn.Linear(8, 8),
        az.build("standard", d_model=8, n_heads=2),
    )
    az.set_backend(model, "chunked")
    assert [m.backend for m in model if isinstance(m, az.AttentionMechanism)] == [
        "chunked",
        "chunked",
    ]
    with pytest.raises(ValueError, match="unknown backend"):
        az.set_backend(model, "bogus")
    assert [m.backend for m in model if isinstance(m, az.AttentionMechanism)] == [
        "chunked",
        "chunked",
    ]
    with pytest.raises(ValueError, match="no attention mechanism"):
        az.set_backend(torch.nn.Linear(2, 2), "naive")


def test_outside_registration_is_listed_built_and_property_tested(restore_registries):
    """A researcher registers a kernel backend and a mechanism from their own file."""

    @az.register_backend(
        "softmax", "my_kernel", tier="fused", priority=-5, capabilities=Capabilities(FEATURES)
    )
    def my_kernel(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
        return naive(q, k, v, attn_mask, is_causal, scale, dropout_p)

    @az.register_mechanism("my_attention")
    class MyAttention(StandardAttention):
        """Standard attention, registered under a new name."""

    assert "my_attention" in az.list_mechanisms()
    assert "my_kernel" in az.list_backends("my_attention")
    m = az.build("my_attention", backend="my_kernel", d_model=8, n_heads=2)
    assert m(torch.randn(1, 3, 8)).shape == (1, 3, 8)

    @given(attention_problems())
    def kernel_agrees(problem):
        assert assert_backends_agree(problem, backends=["my_kernel"]) == {"my_kernel": "ok"}

    kernel_agrees()
    report = assert_mechanism_backends_agree("my_attention", dict(d_model=8, n_heads=2))
    assert report["my_kernel"] == "ok"
    x = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(softmax_attention(x, x, x, backend="my_kernel"), naive(x, x, x))


def test_registering_a_non_mechanism_or_bad_tier_fails(restore_registries):
    with pytest.raises(TypeError, match="must subclass AttentionMechanism"):
        az.register_mechanism("linear")(torch.nn.Linear)
    with pytest.raises(ValueError, match="tier 'fast'"):
        az.register_backend(
            "softmax", "x", tier="fast", priority=0, capabilities=Capabilities(FEATURES)
        )(naive)
