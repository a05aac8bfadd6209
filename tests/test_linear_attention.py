"""Linear attention (Katharopoulos et al. 2020): kernel backends against the float64 naive
reference, outputs and gradients; the paper's factorised form; masks the chunked kernel serves;
clear errors. The mechanism on every backend (agreement, causality, a query with no key,
masks): test_mechanism_contract.py."""

import dataclasses
import functools

import pytest
import torch
from einops import einsum
from hypothesis import given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.kernels import UnsupportedCallError
from attn_zoo.kernels.linear import elu_feature_map, linear_attention
from attn_zoo.kernels.linear.chunked import CHUNK, chunked
from attn_zoo.testing import (
    AttentionProblem,
    assert_backends_agree,
    attention_problems,
)


@dataclasses.dataclass(frozen=True)
class LinearProblem(AttentionProblem):
    """An AttentionProblem for the linear family, whose kernels take no scale."""

    def inputs(self, dtype=None, device="cpu"):
        inputs = super().inputs(dtype, device)
        del inputs["scale"]
        return inputs


def linear_problems(**kwargs):
    """The kit's attention problems (GQA, dv != dk, lengths 1 and odd ...), as LinearProblems."""
    kwargs.setdefault("scales", st.none())
    # chunked serves top-left causality; bottom-right with N != M reaches it as a query mask
    kwargs.setdefault("causal", (False, True))
    return attention_problems(**kwargs).map(
        lambda p: LinearProblem(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)})
    )


KEY_MASKS = ("none", "key_padding")  # masks the chunked backend serves


@given(linear_problems(masks=KEY_MASKS, block_sizes=(CHUNK,)))
def test_chunked_agrees_float32(problem):
    assert assert_backends_agree(problem, "linear", backends=["chunked"]) == {"chunked": "ok"}


# (N, M) one short of, at, one over and several chunks (CHUNK = 64) past the chunk boundary
BOUNDARIES = [(1, 65), (63, 63), (64, 64), (65, 65), (129, 129), (65, 129), (129, 63)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "m"), BOUNDARIES)
def test_every_backend_agrees_around_its_chunk_boundaries(n, m, threads):
    """naive and chunked (default chunk), outputs and grads, with 1 and 2 torch threads."""
    case = BOUNDARIES.index((n, m))
    problem = LinearProblem(
        batch=1, heads=2, kv_heads=1, q_len=n, k_len=m, key_dim=8, value_dim=8,
        mask=KEY_MASKS[case % 2], is_causal=case % 3 != 0, seed=case, threads=threads,
    )  # fmt: skip
    assert assert_backends_agree(problem, "linear") == {"naive": "ok", "chunked": "ok"}


@given(linear_problems(dtypes=(torch.float64,), max_len=40), st.sampled_from([1, 3, 8]))
def test_chunked_multi_chunk_float64(problem, chunk):
    """Small chunks: many chunks, the recurrent state carries most of the sum."""
    if problem.mask not in KEY_MASKS:
        problem = dataclasses.replace(problem, mask="key_padding")
    assert_backends_agree(
        problem, "linear", backends=[], kernels={"chunked": functools.partial(chunked, chunk=chunk)}
    )


@given(linear_problems(dtypes=(torch.float16, torch.bfloat16), max_len=24, masks=KEY_MASKS))
def test_half_precision(problem):
    assert_backends_agree(problem, "linear", backends=["chunked"])


def test_query_dependent_masks_are_served_by_naive_only():
    problem = LinearProblem(mask="empty_rows", is_causal=True, q_len=6, k_len=6, seed=2)
    report = assert_backends_agree(problem, "linear")
    assert report["naive"] == "ok" and "depend on the query" in report["chunked"]
    with pytest.raises(UnsupportedCallError, match="'chunked'.*depend on the query.*can: naive"):
        linear_attention(**problem.inputs(), backend="chunked")


def test_non_causal_is_the_papers_factorised_form():
    """phi(Q) (phi(K)^T V) / phi(Q) sum_j phi(k_j), written independently of the backends."""
    x = LinearProblem(q_len=7, k_len=5, key_dim=3, value_dim=6, dtype=torch.float64).inputs()
    fq, fk = elu_feature_map(x["q"]), elu_feature_map(x["k"])
    kv = einsum(fk, x["v"], "b h m d, b h m e -> b h d e")
    want = einsum(fq, kv, "b h n d, b h d e -> b h n e") / einsum(
        fq, fk.sum(2), "b h n d, b h d -> b h n"
    ).unsqueeze(-1)
    for backend in ("naive", "chunked"):
        torch.testing.assert_close(
            linear_attention(x["q"], x["k"], x["v"], backend=backend), want, atol=1e-12, rtol=0
        )


@pytest.mark.parametrize("is_causal", [False, True])
def test_an_expanded_padding_mask_is_a_key_mask(is_causal):
    """A padding mask (B, 1, 1, M) expanded to (B, H, N, M) with stride 0, as models pass it,
    is the same for every query: the chunked kernel serves it (it was refused as a per-query
    mask) and agrees with the naive one; a mask that differs between queries is still refused."""
    x = LinearProblem(
        batch=2, q_len=CHUNK + 3, k_len=CHUNK + 3, mask="key_padding", seed=2
    ).inputs()
    padding = x["attn_mask"]
    x["attn_mask"] = padding.expand(2, x["q"].shape[1], CHUNK + 3, CHUNK + 3)
    got = linear_attention(**{**x, "is_causal": is_causal}, backend="chunked")
    want = linear_attention(**{**x, "attn_mask": padding, "is_causal": is_causal}, backend="naive")
    torch.testing.assert_close(got, want)
    with pytest.raises(UnsupportedCallError, match="do not depend on the query"):
        linear_attention(**{**x, "attn_mask": x["attn_mask"].clone()}, backend="chunked")


def test_state_dict_and_backends():
    m = az.build("linear", d_model=8, n_heads=2, n_kv_heads=1, key_dim=3)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "wq.weight": (6, 8), "wq.bias": (6,), "wk.weight": (3, 8), "wk.bias": (3,),
        "wv.weight": (4, 8), "wv.bias": (4,), "wo.weight": (8, 8), "wo.bias": (8,),
    }  # fmt: skip
    assert az.list_backends("linear") == ["chunked", "naive"]
    with pytest.raises(ValueError, match="Valid: auto, chunked, naive"):
        m.backend = "fused"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: az.build("linear", d_model=10, n_heads=4), "d_model=10 must be divisible"),
        (lambda: az.build("linear", d_model=8, n_heads=2, key_dim=0), "key_dim=0"),
        (
            lambda: az.build("linear", d_model=8, n_heads=2)(
                torch.randn(1, 3, 8), attn_mask=torch.ones(1, 1, 3, 3, dtype=torch.int8)
            ),
            "attn_mask must be boolean",
        ),
        (
            lambda: az.build("linear", backend="chunked", d_model=8, n_heads=2)(
                torch.randn(1, 3, 8), attn_mask=torch.eye(3, dtype=torch.bool)
            ),
            "linear backend 'chunked' cannot serve.*depend on the query",
        ),
    ],
)
def test_errors_name_the_option_and_what_is_valid(call, match):
    with pytest.raises(ValueError, match=match):
        call()
