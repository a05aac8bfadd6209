"""The kit refuses what it cannot check, by name and before any run: a misspelled kernel
feature or backend, a problem field that is no size or no float dtype; and a kernel without
an autograd graph fails naming itself, the problem and the fix."""

import dataclasses
import re

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from attn_zoo.kernels.softmax.naive import naive
from attn_zoo.testing import (
    MECHANISM_MASKS,
    AttentionProblem,
    MechanismProblem,
    RelationalProblem,
    assert_backends_agree,
    assert_mechanism_backends_agree,
    attention_problems,
    mechanism_problems,
    relational_problems,
)

KWARGS = {"d_model": 8, "n_heads": 2}


def always_123(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, **mods):
    """Plainly wrong, and in the graph of every input."""
    return (q.sum() + k.sum() + v.sum()) * 0 + q.new_full((*q.shape[:3], v.shape[-1]), 123.0)


@dataclasses.dataclass(frozen=True)
class Counted:
    """`problem`, counting the inputs it builds (none: the kit refused before any run)."""

    problem: AttentionProblem
    built: list = dataclasses.field(default_factory=list)

    @property
    def dtype(self):
        return self.problem.dtype

    def inputs(self, dtype=None, device="cpu"):
        self.built.append(dtype)
        return self.problem.inputs(dtype, device)


@pytest.mark.parametrize("typo", ["score_mods", "scoremod", "Score_mod"])
def test_a_misspelled_kernel_feature_is_refused_before_any_run(typo):
    problem = Counted(AttentionProblem(score_mod="alibi", is_causal=True))
    with pytest.raises(
        ValueError,
        match=f"unknown kernel_features entry: '{typo}'. Did you mean 'score_mod'.*Valid: .*"
        "mask_mod.*score_mod",
    ):
        assert_backends_agree(
            problem, backends=[], kernels={"mine": always_123}, kernel_features={typo}
        )
    assert problem.built == []
    with pytest.raises(AssertionError, match="backend 'mine' disagrees"):  # spelled right
        assert_backends_agree(
            problem, backends=[], kernels={"mine": always_123}, kernel_features={"score_mod"}
        )


def test_a_lone_name_where_names_are_asked_is_refused():
    problem = AttentionProblem()
    with pytest.raises(ValueError, match=r"kernel_features='score_mod': give a collection"):
        assert_backends_agree(problem, kernels={"mine": naive}, kernel_features="score_mod")
    with pytest.raises(ValueError, match=r"backends='sdpa': give a collection of names"):
        assert_backends_agree(problem, backends="sdpa")
    with pytest.raises(ValueError, match=r"backends='sdpa': give a collection of names"):
        assert_mechanism_backends_agree("standard", KWARGS, backends="sdpa")


def test_an_unknown_backend_is_refused_before_any_run():
    problem = Counted(AttentionProblem())
    with pytest.raises(ValueError, match="unknown backends entry: 'sdpaa'. Did you mean 'sdpa'"):
        assert_backends_agree(problem, backends=["sdpaa"])
    assert problem.built == []
    with pytest.raises(ValueError, match="unknown backends entry: 'sdpaa'. Did you mean 'sdpa'"):
        assert_mechanism_backends_agree("standard", KWARGS, backends=["sdpaa"])


@pytest.mark.parametrize(
    "strategy, message",
    [
        (attention_problems(masks=("none", "randm")),
         "unknown masks entry: 'randm'. Did you mean 'random'"),
        (attention_problems(layouts="strided"), "layouts='strided': give a collection of names"),
        (relational_problems(rel_activations=("identity", "relu6")),
         "unknown rel_activations entry: 'relu6'. Did you mean 'relu'"),
        (relational_problems(masks="additive"), "masks='additive': give a collection of names"),
        (mechanism_problems(masks=("padding", "per_querry")),
         "unknown masks entry: 'per_querry'. Did you mean 'per_query'"),
    ],
)  # fmt: skip
def test_a_strategy_refuses_a_name_it_does_not_know_at_its_first_draw(strategy, message):
    with pytest.raises(ValueError, match=message):
        find(strategy, lambda problem: True)


@pytest.mark.parametrize(
    "problem, fields, message",
    [
        (AttentionProblem, dict(kv_heads=0), "kv_heads=0: must be an integer >= 1"),
        (AttentionProblem, dict(heads=0, kv_heads=1), "heads=0: must be an integer >= 1"),
        (AttentionProblem, dict(batch=0), "batch=0: must be an integer >= 1"),
        (AttentionProblem, dict(q_len=-1), "q_len=-1: must be an integer >= 0"),
        (AttentionProblem, dict(k_len=2.0), "k_len=2.0: must be an integer >= 0"),
        (AttentionProblem, dict(key_dim=0), "key_dim=0: must be an integer >= 1"),
        (AttentionProblem, dict(value_dim=0), "value_dim=0: must be an integer >= 1"),
        (AttentionProblem, dict(dtype=torch.int64),
         "dtype=torch.int64: valid are bfloat16, float16, float32, float64"),
        (AttentionProblem, dict(scale=float("nan")), "scale=nan: must be None or a finite"),
        (RelationalProblem, dict(n_relations=0), "n_relations=0: must be an integer >= 1"),
        (RelationalProblem, dict(rel_dim=0), "rel_dim=0: must be an integer >= 1"),
        (RelationalProblem, dict(head_dim=0), "head_dim=0: must be an integer >= 1"),
        (RelationalProblem, dict(max_rel_pos=-1), "max_rel_pos=-1: must be an integer >= 0"),
        (RelationalProblem, dict(rel_scale=float("inf")), "rel_scale=inf: must be None or a"),
        (MechanismProblem, dict(batch=0), "batch=0: must be an integer >= 1"),
        (MechanismProblem, dict(length=-3), "length=-3: must be an integer >= 0"),
        (MechanismProblem, dict(dtype=torch.int32), "dtype=torch.int32: valid are bfloat16"),
    ],
)  # fmt: skip
def test_a_problem_field_that_cannot_be_checked_is_refused_by_name(problem, fields, message):
    with pytest.raises(ValueError, match=message):
        problem(**fields)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(batch=0), "batch=0: must be an integer >= 1"),
        (dict(length=-1), "length=-1: must be an integer >= 0 or None"),
        (dict(dtype=torch.int32), "dtype=torch.int32: valid are bfloat16"),
    ],
)
def test_the_mechanism_check_refuses_a_call_it_cannot_check(arguments, message):
    with pytest.raises(ValueError, match=message):
        assert_mechanism_backends_agree("standard", KWARGS, **arguments)


@pytest.mark.parametrize("fields", [dict(q_len=0), dict(k_len=0), dict(q_len=0, k_len=0)])
def test_no_queries_or_no_keys_stay_problems_of_the_kit(fields):
    report = assert_backends_agree(AttentionProblem(**fields))
    assert report["naive"] == report["chunked"] == "ok"
    relational = assert_backends_agree(RelationalProblem(**fields), "relational")
    assert relational["naive"] == "ok"


@pytest.mark.parametrize("mask", ["none", *MECHANISM_MASKS])
def test_an_empty_sequence_stays_a_mechanism_problem_with_every_mask(mask):
    problem = MechanismProblem(length=0, mask=mask)
    assert problem.attn_mask() is None or problem.attn_mask().shape[-1] == 0
    report = assert_mechanism_backends_agree("standard", KWARGS, **problem.arguments())
    assert report["naive"] == "ok"


def under_no_grad(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    with torch.no_grad():  # as a kernel of an inference library, or through NumPy
        return naive(q, k, v, attn_mask, is_causal, scale, dropout_p)


def ignores_the_gradient_of_v(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    return naive(q, k, v.detach(), attn_mask, is_causal, scale, dropout_p)


@pytest.mark.parametrize(
    "kernel, why",
    [
        (under_no_grad, "no gradient for q, k, v \\(compared as zeros\\): the output carries "
                        "no autograd graph"),
        (ignores_the_gradient_of_v, "no gradient for v \\(compared as zeros\\): the output's "
                                    "autograd graph does not reach v"),
    ],
)  # fmt: skip
def test_a_kernel_without_gradients_fails_naming_itself_the_problem_and_the_fix(kernel, why):
    problem = AttentionProblem(seed=3)
    with pytest.raises(AssertionError) as failure:
        assert_backends_agree(problem, backends=[], kernels={"mine": kernel})
    message = str(failure.value)
    assert "softmax backend 'mine' disagrees" in message and "grad v: " in message
    assert f"Problem: {problem!r}" in message
    assert "torch.autograd.Function" in message and "grads=False" in message
    assert re.search(why, message), message
    report = assert_backends_agree(problem, backends=[], kernels={"mine": kernel}, grads=False)
    assert report == {"mine": "ok"}


def zeros_without_keys(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    """With no keys, zeros (as flex.py returns them), a constant: no autograd graph."""
    if k.shape[2] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[-1])
    return naive(q, k, v, attn_mask, is_causal, scale, dropout_p)


def test_a_constant_output_passes_where_every_gradient_is_zero():
    report = assert_backends_agree(
        AttentionProblem(k_len=0), backends=[], kernels={"mine": zeros_without_keys}
    )
    assert report == {"mine": "ok"}


# --- a check that compares nothing is no pass (the sixth hostile pass) ---------------------


def test_asking_to_check_nothing_is_refused_before_any_work():
    """backends=[] and no kernels returned {}: a test that could not fail."""
    with pytest.raises(ValueError, match=r"backends=\[\] and no kernels: nothing to check"):
        assert_backends_agree(AttentionProblem(), backends=[])


def test_a_call_whose_every_kernel_is_skipped_fails_naming_why():
    """A kernel not declaring score_mod, on a problem with one and no backend beside it,
    returned {'mine': 'skipped: ...'}; now nothing compared is an AssertionError, and under
    @given such a problem is rejected (another is drawn)."""
    problem = AttentionProblem(score_mod="relative_bias")
    with pytest.raises(AssertionError, match=r"nothing was compared on this problem: mine "):
        assert_backends_agree(problem, backends=[], kernels={"mine": always_123})

    @given(st.just(problem))
    @settings(database=None, max_examples=5)
    def every_draw_skipped(p):
        assert_backends_agree(p, backends=[], kernels={"mine": always_123})

    with pytest.raises(Unsatisfiable):
        every_draw_skipped()
