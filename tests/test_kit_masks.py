"""The mechanism kit draws masks by default (key padding and per query, boolean and additive),
so a backend or a mechanism that drops the mask fails it; `mechanism_problems` draws the same
masks, with rows that see no key, at lengths 1 and odd."""

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis.errors import NoSuchExample

import attn_zoo as az
from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.softmax.family import FEATURES
from attn_zoo.kernels.softmax.naive import naive
from attn_zoo.mechanisms.standard import StandardAttention
from attn_zoo.testing import (
    MECHANISM_MASKS,
    MechanismProblem,
    assert_mechanism_backends_agree,
    mechanism_problems,
)

KWARGS = {"d_model": 8, "n_heads": 2}


def drops_the_mask(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    return naive(q, k, v, None, is_causal, scale, dropout_p)


def right(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    return naive(q, k, v, attn_mask, is_causal, scale, dropout_p)


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_backend_that_drops_the_mask_fails_the_kit_and_a_right_one_passes(
    restore_registries, is_causal
):
    for name, fn in (("drops_the_mask", drops_the_mask), ("right", right)):
        register_backend("softmax", name, tier="fused", priority=-100,
                         capabilities=Capabilities(FEATURES))(fn)  # fmt: skip
    with pytest.raises(AssertionError, match="backend 'drops_the_mask' disagrees(.|\n)*mask "):
        assert_mechanism_backends_agree("standard", KWARGS, length=9, is_causal=is_causal,
                                        backends=["drops_the_mask"])  # fmt: skip
    report = assert_mechanism_backends_agree("standard", KWARGS, length=9, is_causal=is_causal,
                                             backends=["right", "chunked", "sdpa"])  # fmt: skip
    assert report == {"right": "ok", "chunked": "ok", "sdpa": "ok"}


@pytest.mark.parametrize("kind", MECHANISM_MASKS)
def test_each_mask_kind_alone_catches_a_mechanism_that_drops_it_off_its_naive_path(
    restore_registries, kind
):
    @az.register_mechanism("drops_mask_off_naive")
    class DropsMask(StandardAttention):
        def forward(self, x, symbols=None, attn_mask=None, is_causal=False, **call):
            mask = attn_mask if self.backend == "naive" else None
            return super().forward(x, symbols, mask, is_causal, **call)

    with pytest.raises(AssertionError, match="backend 'chunked' disagrees"):
        assert_mechanism_backends_agree("drops_mask_off_naive", KWARGS, length=7, masks=(kind,),
                                        backends=["chunked"])  # fmt: skip
    report = assert_mechanism_backends_agree("drops_mask_off_naive", KWARGS, length=7, masks=(),
                                             backends=["chunked"])  # fmt: skip
    assert report == {"chunked": "ok"}  # without a mask it agrees


def test_what_a_mechanism_or_a_backend_refuses_is_skipped():
    """gla takes no mask (ValueError): its drawn masks are skipped; linear's chunked kernel
    serves masks the same for every query only (UnsupportedCallError): it is checked on
    those, named or not."""
    gla = assert_mechanism_backends_agree("gla", KWARGS, length=9, is_causal=True)
    assert gla == {"chunked": "ok", "naive": "ok"}
    linear = assert_mechanism_backends_agree("linear", KWARGS, length=9, backends=["chunked"])
    assert linear == {"chunked": "ok"}
    with pytest.raises(ValueError, match="masks\\[0\\]='per_querry': valid kinds are"):
        assert_mechanism_backends_agree("standard", KWARGS, length=9, masks=("per_querry",))


def reaches(condition) -> bool:
    try:
        find(mechanism_problems(), condition, settings=settings(database=None, max_examples=500))
    except NoSuchExample:
        return False
    return True


def empty_rows(problem: MechanismProblem) -> bool:
    """Whether some query of the problem's call sees no key (its mask and causality)."""
    mask = problem.attn_mask()
    if mask is None:
        return False
    n = problem.length
    seen = (mask if mask.dtype == torch.bool else mask > -torch.inf).expand(-1, -1, n, n)
    if problem.is_causal:
        seen = seen & torch.ones(n, n, dtype=torch.bool).tril()
    return bool((~seen.any(-1)).any())


def test_the_strategy_draws_every_mask_with_empty_rows_at_length_one_and_odd_lengths():
    for kind in MECHANISM_MASKS:
        assert reaches(lambda p, kind=kind: p.mask == kind and empty_rows(p)), kind
        assert reaches(lambda p, kind=kind: p.mask == kind and p.length == 1), kind
        assert reaches(lambda p, kind=kind: p.mask == kind and p.length % 2 and p.length > 1)
    assert reaches(lambda p: p.mask == "none") and reaches(lambda p: p.is_causal)
    assert reaches(lambda p: p.batch == 3)
    with pytest.raises(ValueError, match="mask='random': valid kinds are"):
        MechanismProblem(mask="random")


@settings(max_examples=10)
@given(mechanism_problems(max_len=20))
def test_drawn_problems_run_the_kit(problem):
    report = assert_mechanism_backends_agree(
        "standard", KWARGS, backends=["naive", "chunked", "sdpa"], **problem.arguments()
    )
    assert set(report.values()) == {"ok"}
