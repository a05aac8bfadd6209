"""Blind spots of the testing kit the seventh hostile pass found: the mechanism kit's floor
(naive's own error in the checked dtype) widened every tolerance without bound, so a naive path
wrong in that dtype passed and hid wrong backends; and the kernel kit set requires_grad on
q, k and v together, so a backward wrong only when some input needs no gradient passed."""

import pytest
import torch
from hypothesis import HealthCheck, find, settings
from hypothesis.errors import NoSuchExample

import attn_zoo as az
from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.softmax.family import FEATURES
from attn_zoo.kernels.softmax.naive import naive
from attn_zoo.mechanisms.standard import StandardAttention
from attn_zoo.testing import (
    AttentionProblem,
    RelationalProblem,
    assert_backends_agree,
    assert_mechanism_backends_agree,
    attention_problems,
    relational_problems,
)

KWARGS = {"d_model": 16, "n_heads": 2}


def register_off_in_float32() -> None:
    """A mechanism whose naive path is half again too large in float32 only (a dtype-dependent
    bug of its own low-precision path); every other backend and float64 are right."""

    @az.register_mechanism("off_in_float32")
    class OffInFloat32(StandardAttention):
        def forward(self, x, *args, **kwargs):
            out = super().forward(x, *args, **kwargs)
            return 1.5 * out if self.backend == "naive" and x.dtype == torch.float32 else out


def test_a_naive_path_wrong_in_the_checked_dtype_fails_naming_naive_and_its_error(
    restore_registries,
):
    """It passed: naive's float32 run is the floor, and it widened every tolerance by twice
    its own 50% error. naive is now held to the floor's bound; the right backends pass."""
    register_off_in_float32()
    with pytest.raises(AssertionError) as failure:
        assert_mechanism_backends_agree("off_in_float32", KWARGS, length=9, masks=())
    message = str(failure.value)
    assert "backend 'naive' disagrees with the float64 naive reference (torch.float32)" in message
    assert "\n  output: max abs err 0." in message  # the size of the error, a third of |want|
    assert "more is a wrong torch.float32 path" in message
    report = assert_mechanism_backends_agree(
        "off_in_float32", KWARGS, length=9, masks=(), backends=["chunked", "sdpa"]
    )
    assert report == {"chunked": "ok", "sdpa": "ok"}


def scale_a_quarter_high(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    return naive(q, k, v, attn_mask, is_causal, 1.25 * (scale or q.shape[-1] ** -0.5), dropout_p)


def test_a_wrong_naive_path_no_longer_widens_the_tolerance_of_a_wrong_backend(
    restore_registries,
):
    """A backend with a quarter too large a scale passed beside the 50% naive float32 path
    (its error smaller than twice naive's); the floor now counts at most its bound."""
    register_off_in_float32()
    register_backend("softmax", "quarter_high", tier="fused", priority=-100,
                     capabilities=Capabilities(FEATURES))(scale_a_quarter_high)  # fmt: skip
    with pytest.raises(AssertionError, match="backend 'quarter_high' disagrees"):
        assert_mechanism_backends_agree(
            "off_in_float32", KWARGS, length=9, masks=(), backends=["quarter_high"]
        )


class FrozenKeysLoseDq(torch.autograd.Function):
    """Softmax attention whose backward computes the score gradient only where k needs one:
    with k frozen, dq is zero."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        p = torch.softmax(q @ k.transpose(-1, -2) * scale, -1)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return p @ v

    @staticmethod
    def backward(ctx, g):
        q, k, v, p = ctx.saved_tensors
        dp = g @ v.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) if ctx.needs_input_grad[1] else 0 * p
        dq, dk = ds @ k * ctx.scale, ds.transpose(-1, -2) @ q * ctx.scale
        return dq, dk, p.transpose(-1, -2) @ g, None


def frozen_keys_lose_dq(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    """No mask, not causal (the problems below have neither)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return FrozenKeysLoseDq.apply(q, k, v, scale)


def fails(problem) -> bool:
    try:
        assert_backends_agree(problem, backends=[], kernels={"bug": frozen_keys_lose_dq})
    except AssertionError:
        return True
    return False


def test_a_backward_wrong_for_frozen_keys_is_found_and_shrunk_to_a_frozen_k():
    """Every input required grad in every problem: the kernel passed. Problems now draw
    which inputs require none (`frozen`), and the search shrinks to k frozen, q not."""
    search = settings(database=None, max_examples=100, suppress_health_check=list(HealthCheck))
    found = find(attention_problems(masks=("none",), causal=(False,)), fails, settings=search)
    assert "k" in found.frozen and "q" not in found.frozen
    assert not fails(AttentionProblem())  # every input requiring grad: right
    with pytest.raises(AssertionError, match=r"'bug' disagrees(.|\n)*grad q: max abs err") as err:
        assert_backends_agree(AttentionProblem(frozen=("k", "v")), backends=[],
                              kernels={"bug": frozen_keys_lose_dq})  # fmt: skip
    assert "grad k" not in str(err.value) and "grad v" not in str(err.value)


@pytest.mark.parametrize("frozen", [("q",), ("k", "v"), ("v",), ("q", "k", "v")])
def test_every_backend_agrees_with_some_inputs_frozen(frozen):
    """The registered backends, and the inputs they get: the frozen ones require no grad."""
    seen = []

    def records(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
        seen.append({name: t.requires_grad for name, t in (("q", q), ("k", k), ("v", v))})
        return naive(q, k, v, attn_mask, is_causal, scale, dropout_p)

    problem = AttentionProblem(mask="additive", is_causal=True, q_len=5, k_len=7, frozen=frozen)
    report = assert_backends_agree(problem, kernels={"records": records})
    assert report["records"] == report["chunked"] == report["sdpa"] == "ok"
    assert seen[-1] == {name: name not in frozen for name in ("q", "k", "v")}
    relational = RelationalProblem(q_len=5, k_len=6, frozen=tuple(n for n in frozen if n != "v"))
    report = assert_backends_agree(relational, "relational", backends=["naive", "chunked"])
    assert set(report.values()) == {"ok"}


def reaches(strategy, condition, examples: int = 300) -> bool:
    try:
        find(strategy, condition, settings=settings(database=None, max_examples=examples))
    except NoSuchExample:
        return False
    return True


def test_the_strategies_draw_frozen_inputs_and_refuse_unknown_ones():
    for frozen in [("k",), ("k", "v"), ("q", "k", "v")]:
        assert reaches(attention_problems(), lambda p, f=frozen: p.frozen == f), frozen
    assert not reaches(attention_problems(freeze=()), lambda p: p.frozen != (), examples=20)
    assert reaches(relational_problems(relative=(True,)), lambda p: "v_rel" in p.frozen)
    with pytest.raises(ValueError, match="unknown frozen entry: 'kk'. Did you mean 'k'"):
        AttentionProblem(frozen=("kk",))
    with pytest.raises(ValueError, match="frozen='q': give a collection of names"):
        AttentionProblem(frozen="q")
    with pytest.raises(ValueError, match="unknown frozen entry: 'v'"):
        RelationalProblem(max_rel_pos=2, frozen=("v",))
    with pytest.raises(ValueError, match="unknown freeze entry: 'x'"):
        find(attention_problems(freeze=("x",)), lambda p: True)
