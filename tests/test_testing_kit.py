"""The kit catches wrong kernels and says where; strategies cover the edge cases."""

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis.errors import NoSuchExample

import attn_zoo as az
from attn_zoo.kernels.softmax.naive import naive
from attn_zoo.testing import (
    ALL_MASK_MODS,
    ALL_SCORE_MODS,
    MASK_MODS,
    SCORE_MODS,
    AttentionProblem,
    assert_backends_agree,
    assert_mechanism_backends_agree,
    attention_problems,
    block_edges,
    lengths,
    relational_problems,
    torch_threads,
)


def forgets_the_mask(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    return naive(q, k, v, None, is_causal, scale, dropout_p)


def wrong_scale(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
    return naive(q, k, v, attn_mask, is_causal, 1.01 * (scale or q.shape[-1] ** -0.5), dropout_p)


def test_a_wrong_kernel_fails_with_a_named_worst_case():
    problem = AttentionProblem(mask="random", q_len=6, k_len=9, seed=4)
    with pytest.raises(
        AssertionError, match=r"backend 'forgets_the_mask'.*\n.*output: max abs err .* worst at \("
    ) as err:
        assert_backends_agree(problem, backends=[], kernels={"forgets_the_mask": forgets_the_mask})
    assert "Problem: AttentionProblem(" in str(err.value)


def test_small_errors_are_caught_in_gradients():
    problem = AttentionProblem(q_len=5, k_len=5, seed=1)
    with pytest.raises(AssertionError, match="wrong_scale"):
        assert_backends_agree(problem, backends=[], kernels={"wrong_scale": wrong_scale})


def test_hypothesis_finds_and_shrinks_a_masking_bug():
    def agrees(problem):
        try:
            assert_backends_agree(
                problem, backends=[], kernels={"bug": forgets_the_mask}, grads=False
            )
        except AssertionError:
            return False
        return True

    found = find(
        attention_problems(),
        lambda p: not agrees(p),
        settings=settings(database=None, max_examples=200, suppress_health_check=list(HealthCheck)),
    )
    # shrunk to a problem that has a mask: a drawn one, or bottom-right causality with N != M,
    # which reaches a kernel as a mask too (which of the two the search shrinks to was seen to
    # change with the modules the process had imported)
    assert found.mask != "none" or (
        found.is_causal == "bottom_right" and found.q_len != found.k_len
    )


def test_nan_output_fails():
    def nan_kernel(q, k, v, **kw):
        return naive(q, k, v, **kw) * float("nan")

    with pytest.raises(AssertionError, match="max abs err inf"):
        assert_backends_agree(AttentionProblem(), backends=[], kernels={"nan": nan_kernel})


def test_correct_kernel_passes_even_in_low_precision():
    for dtype in (torch.float16, torch.bfloat16):
        problem = AttentionProblem(
            mask="empty_rows", is_causal=True, q_len=33, k_len=40, dtype=dtype
        )
        assert assert_backends_agree(problem, backends=["chunked", "sdpa"]) == {
            "chunked": "ok",
            "sdpa": "ok",
        }


@settings(max_examples=60)
@given(attention_problems())
def test_problems_are_valid_and_reproducible(problem):
    a, b = problem.inputs(), problem.inputs()
    assert torch.equal(a["q"], b["q"])
    assert a["q"].shape == (problem.batch, problem.heads, problem.q_len, problem.key_dim)
    assert a["v"].shape[-1] == problem.value_dim
    assert problem.heads % problem.kv_heads == 0
    assert max(problem.q_len, problem.k_len) <= 100 and problem.threads in (1, 2)


def test_strategies_reach_the_edge_cases():
    def reaches(condition):
        try:
            find(
                attention_problems(), condition, settings=settings(database=None, max_examples=500)
            )
        except NoSuchExample:
            return False
        return True

    assert reaches(lambda p: p.q_len == 1)
    assert reaches(lambda p: p.k_len & (p.k_len - 1) != 0)  # not a power of two
    assert reaches(
        lambda p: p.mask == "empty_rows" and not bool(p.inputs()["attn_mask"].any(-1).all())
    )
    assert reaches(lambda p: p.key_dim != p.value_dim)
    assert reaches(lambda p: p.heads != p.kv_heads)


def reaches(strategy, condition) -> bool:
    try:
        find(strategy, condition, settings=settings(database=None, max_examples=500))
    except NoSuchExample:
        return False
    return True


def test_strategies_reach_block_edges_and_both_thread_counts():
    """Given block sizes, lengths one short of a block, exact, one over and 2 blocks + 1 are
    drawn (even above max_len); problems run with 1 or 2 torch threads."""
    assert block_edges(256) == (255, 256, 257, 513)
    assert block_edges(1) == (1, 2, 3)
    for n in (31, 32, 33, 65, 255, 256, 257, 513):
        assert reaches(lengths(100, block_sizes=(32, 256)), lambda x, n=n: x == n), n
    for problems in (attention_problems, relational_problems):
        assert reaches(problems(block_sizes=(256,)), lambda p: p.q_len == 513)
        assert reaches(problems(block_sizes=(256,)), lambda p: p.k_len == 257)
        for threads in (1, 2):
            assert reaches(problems(), lambda p, t=threads: p.threads == t)


def test_the_kit_runs_every_kernel_with_the_problems_thread_count():
    before, seen = torch.get_num_threads(), []

    def records(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
        seen.append(torch.get_num_threads())
        return naive(q, k, v, attn_mask, is_causal, scale, dropout_p)

    for threads in (1, 2):
        problem = AttentionProblem(threads=threads)
        assert_backends_agree(problem, backends=[], kernels={"records": records})
        assert seen[-1] == threads
        assert torch.get_num_threads() == before


def test_torch_threads_restores_the_count_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"), torch_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads=0: must be None or an integer >= 1"):
        AttentionProblem(threads=0)


def test_the_mechanism_check_catches_a_dropped_last_key_block_by_default():
    """A planted bug: a 'chunked' softmax kernel that drops the last partial key block when
    there are several blocks. At the old default length (9, one block) it agrees; the default
    lengths (`mechanism_lengths`: the edges of every declared block) catch it."""
    from attn_zoo.kernels.dispatch import Capabilities, family, register_backend
    from attn_zoo.kernels.softmax.chunked import BLOCK, chunked
    from attn_zoo.kernels.softmax.family import FEATURES
    from attn_zoo.testing import mechanism_lengths

    @register_backend("softmax", "dropping", tier="fused", priority=-100,
                      capabilities=Capabilities(FEATURES), block_sizes=(BLOCK,))  # fmt: skip
    def dropping(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0):
        m = k.shape[2]
        keep = m - m % BLOCK if m > BLOCK else m  # the last partial block is lost
        mask = None if attn_mask is None else attn_mask[..., :keep]
        return chunked(q, k[:, :, :keep], v[:, :, :keep], mask, is_causal, scale, dropout_p)

    try:
        kwargs = {"d_model": 8, "n_heads": 2}
        layer = az.build("standard", **kwargs)
        assert {BLOCK - 1, BLOCK + 1, 2 * BLOCK + 1} <= set(mechanism_lengths(layer))
        ok = assert_mechanism_backends_agree("standard", kwargs, length=9, backends=["dropping"])
        assert ok == {"dropping": "ok"}  # what the old default saw
        with pytest.raises(AssertionError, match="backend 'dropping' disagrees"):
            assert_mechanism_backends_agree("standard", kwargs, backends=["dropping"])
    finally:
        del family("softmax").backends["dropping"]


def ignores_the_score_mod(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0,
                          score_mod=None, mask_mod=None):  # fmt: skip
    return naive(q, k, v, attn_mask, is_causal, scale, dropout_p, None, mask_mod)


def window_one_short(b, h, q_idx, kv_idx):  # a user's mask mod: keys i - 1 .. i
    return (kv_idx <= q_idx) & (q_idx - kv_idx < 2)


def test_the_kit_draws_its_mods_and_a_users_and_catches_a_kernel_that_drops_one():
    """Problems drawn with mods hold each of the kit's and the user's; a kernel that declares
    score_mod but ignores it is caught (and shrunk to a problem with a score mod); one that
    does not declare it is reported skipped, not run without it."""
    search = settings(database=None, max_examples=500)
    drawn = attention_problems(score_mods=ALL_SCORE_MODS, mask_mods=(*ALL_MASK_MODS,
                                                                     window_one_short))  # fmt: skip
    for mod in (*SCORE_MODS, None):
        find(drawn, lambda p, mod=mod: p.score_mod == mod, settings=search)
    for mod in (*MASK_MODS, window_one_short):
        find(drawn, lambda p, mod=mod: p.mask_mod is mod or p.mask_mod == mod, settings=search)

    def agrees(problem):
        try:
            assert_backends_agree(
                problem, backends=[], kernels={"bug": ignores_the_score_mod},
                kernel_features={"score_mod", "mask_mod"}, grads=False,
            )  # fmt: skip
        except AssertionError:
            return False
        return True

    found = find(drawn, lambda p: not agrees(p), settings=search)
    assert found.score_mod is not None
    problem = AttentionProblem(q_len=5, k_len=5, score_mod="softcap", mask_mod=window_one_short)
    report = assert_backends_agree(problem, backends=["naive", "sdpa"],
                                   kernels={"bug": ignores_the_score_mod})  # fmt: skip
    assert report["bug"].startswith("skipped") and report["sdpa"].startswith("skipped")
    with pytest.raises(ValueError, match="mod='nope': the kit's are"):
        AttentionProblem(score_mod="nope")


@given(attention_problems(max_len=40, score_mods=ALL_SCORE_MODS, mask_mods=ALL_MASK_MODS))
def test_every_backend_agrees_under_the_kits_mods(problem):
    """naive and chunked run every mod, sdpa the mask mods (as masks): outputs and gradients
    equal the float64 naive path's."""
    report = assert_backends_agree(problem)
    assert report["chunked"] == "ok"
    assert report["sdpa"] == "ok" or problem.score_mod is not None
