"""Additive attention (Fastformer): the scan kernel against the float64 naive reference,
outputs and gradients; numerical stability; the paper's global form; clear errors. The
mechanism on every backend (agreement, causality, masks, training): test_mechanism_contract.py."""

import dataclasses
import functools

import pytest
import torch
from einops import einsum
from hypothesis import given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.kernels import UnsupportedCallError
from attn_zoo.kernels.additive import additive_attention
from attn_zoo.kernels.additive.scan import BLOCK, scan
from attn_zoo.testing import (
    AttentionProblem,
    assert_backends_agree,
    attention_problems,
)


@dataclasses.dataclass(frozen=True)
class AdditiveProblem(AttentionProblem):
    """An AttentionProblem (self-attention: q, k, v of one shape) plus the per-head scoring
    vectors wq, wk (heads, key_dim) of the additive family; `score_scale` stretches them."""

    score_scale: float = 1.0

    def inputs(self, dtype=None, device="cpu"):
        inputs = super().inputs(dtype, device)
        gen = torch.Generator().manual_seed(self.seed + 1)
        for name in ("wq", "wk"):
            w = torch.randn(self.heads, self.key_dim, generator=gen, dtype=torch.float64)
            w = (w * self.score_scale).to(inputs["q"].dtype).to(device)
            inputs[name] = w.requires_grad_(True)
        return inputs


def additive_problems(**kwargs):
    kwargs.update(same_lengths=True, same_widths=True, max_groups=1)
    return attention_problems(**kwargs).map(
        lambda p: AdditiveProblem(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)})
    )


KEY_MASKS = ("none", "key_padding")  # masks the scan serves


@given(additive_problems(masks=KEY_MASKS, block_sizes=(BLOCK,)))
def test_scan_agrees_float32(problem):
    assert assert_backends_agree(problem, "additive", backends=["scan"]) == {"scan": "ok"}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 1])
@pytest.mark.parametrize("is_causal", [False, True])
def test_every_backend_agrees_around_its_block_boundaries(n, is_causal, threads):
    """naive and scan (default block, 64), outputs and grads, with 1 and 2 torch threads."""
    problem = AdditiveProblem(
        batch=1, heads=2, kv_heads=2, q_len=n, k_len=n, key_dim=8, value_dim=8,
        mask="key_padding" if is_causal else "none", is_causal=is_causal, seed=n,
        threads=threads,
    )  # fmt: skip
    assert assert_backends_agree(problem, "additive") == {"naive": "ok", "scan": "ok"}


@given(
    additive_problems(dtypes=(torch.float64,), max_len=40, masks=KEY_MASKS, causal=(True,)),
    st.sampled_from([1, 4, 7]),
)
def test_scan_multi_block_float64(problem, block):
    """Small blocks: the scan over block states carries most of each prefix."""
    assert_backends_agree(
        problem, "additive", backends=[], kernels={"scan": functools.partial(scan, block=block)}
    )


# Scales up to 1: at 1.94 (float16, causal, 22 positions) the float16 arithmetic itself, the
# naive backend's alike, is 0.0147 off in grad q (atol 0.01): the comparison would then test
# float16, not the backend.
@given(additive_problems(dtypes=(torch.float16, torch.bfloat16), max_len=24, masks=KEY_MASKS,
                         scales=st.one_of(st.none(), st.floats(0.05, 1.0))))  # fmt: skip
def test_half_precision(problem):
    assert_backends_agree(problem, "additive", backends=["scan"])


@pytest.mark.parametrize("block", [4, 64])
def test_scan_is_stable_when_scores_span_more_than_exp_can_hold(block):
    """Scores spread over thousands: e^(a - c) for any one constant c overflows or underflows
    (float32 range about +-88, float64 +-709), yet the running-max scan stays finite and exact.
    float32 compares outputs only: at scores this large the gradients are ill-conditioned
    (float32 rounding of the scores times scoring vectors of size ~600) in every backend."""
    problem = AdditiveProblem(q_len=150, k_len=150, is_causal=True, seed=5, score_scale=600.0)
    x = problem.inputs(torch.float64)
    spread = einsum(x["q"], x["wq"], "b h n d, h d -> b h n").detach() * 0.5
    assert float(spread.amax(-1).amin() - spread.amin(-1).amax()) > 2000
    kernels = {"scan": functools.partial(scan, block=block)}
    assert_backends_agree(problem, "additive", backends=[], kernels=kernels, grads=False)
    problem = dataclasses.replace(problem, dtype=torch.float64)
    assert_backends_agree(problem, "additive", backends=[], kernels=kernels)


def test_non_causal_is_the_papers_global_form():
    """One global query and key per sequence, written independently of the backends."""
    x = AdditiveProblem(q_len=9, k_len=9, key_dim=5, value_dim=5, dtype=torch.float64).inputs()
    q, k, v, wq, wk = (x[n] for n in ("q", "k", "v", "wq", "wk"))
    s = 5**-0.5
    alpha = (einsum(q, wq, "b h n d, h d -> b h n") * s).softmax(-1)
    gq = einsum(alpha, q, "b h n, b h n d -> b h d")
    p = gq[:, :, None] * k
    beta = (einsum(p, wk, "b h n d, h d -> b h n") * s).softmax(-1)
    want = einsum(beta, p, "b h n, b h n d -> b h d")[:, :, None] * v
    for backend in ("naive", "scan"):
        got = additive_attention(q, k, v, wq, wk, backend=backend)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_query_dependent_masks_are_served_by_naive_only():
    problem = AdditiveProblem(mask="random", q_len=6, k_len=6, seed=2)
    report = assert_backends_agree(problem, "additive")
    assert report["naive"] == "ok" and "depend on the query" in report["scan"]
    with pytest.raises(UnsupportedCallError, match="'scan'.*depend on the query.*can: naive"):
        additive_attention(**problem.inputs(), backend="scan")


def test_state_dict_and_backends():
    m = az.build("additive", d_model=8, n_heads=2, bias=False)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "wq.weight": (8, 8), "wk.weight": (8, 8), "wv.weight": (8, 8),
        "query_score": (2, 4), "key_score": (2, 4), "wr.weight": (8, 8), "wo.weight": (8, 8),
    }  # fmt: skip
    assert az.list_backends("additive") == ["scan", "naive", "chunked"]
    ok, reason = az.backend_status("additive", "chunked")
    assert ok and "scan" in reason


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: az.build("additive", d_model=10, n_heads=4), "d_model=10 must be divisible"),
        (lambda: az.build("additive", backend="fused", d_model=8, n_heads=2), "Valid: auto"),
        (
            lambda: additive_attention(
                torch.randn(1, 2, 3, 4),
                torch.randn(1, 2, 5, 4),
                torch.randn(1, 2, 3, 4),
                torch.randn(2, 4),
                torch.randn(2, 4),
            ),
            r"k \(1, 2, 5, 4\): q, k and v must all be",
        ),
        (
            lambda: additive_attention(
                *(torch.randn(1, 2, 3, 4) for _ in range(3)), torch.randn(4), torch.randn(2, 4)
            ),
            r"wq \(4,\) must be \(H, d\)",
        ),
    ],
)
def test_errors_name_the_option_and_what_is_valid(call, match):
    with pytest.raises(ValueError, match=match):
        call()
