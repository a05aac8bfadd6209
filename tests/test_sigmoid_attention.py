"""Sigmoid attention (Ramapuram et al. 2024): the chunked kernel against the float64 naive
reference (masks, causality, odd lengths, length 1, many tiles, gradients), O(N) memory, the
mechanism against a transcription of the paper's equations, its bias and its cache."""

import copy
import dataclasses
import functools
import math

import pytest
import torch
from allocations import largest_allocation
from einops import einsum, rearrange
from hypothesis import given
from hypothesis import strategies as st
from package_files import package_file

import attn_zoo as az
from attn_zoo.kernels.sigmoid import sigmoid_attention
from attn_zoo.kernels.sigmoid.chunked import BLOCK, chunked
from attn_zoo.kernels.sigmoid.family import FEATURES
from attn_zoo.kernels.softmax.family import BOTTOM_RIGHT
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.testing import (
    AttentionProblem,
    assert_backends_agree,
    assert_mechanism_backends_agree,
    attention_problems,
)


@dataclasses.dataclass(frozen=True)
class SigmoidProblem(AttentionProblem):
    """An AttentionProblem for the sigmoid family: its kernels also take a bias."""

    bias: float = 0.0

    def inputs(self, dtype=None, device="cpu"):
        return {**super().inputs(dtype, device), "bias": self.bias}


def sigmoid_problems(**kwargs):
    """The kit's attention problems (every mask kind, causal top-left and bottom-right, GQA,
    dv != dk, length 1, odd lengths) with a bias drawn around -log(n)."""
    return st.builds(
        lambda p, bias: SigmoidProblem(
            **{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}, bias=bias
        ),
        attention_problems(**kwargs),
        st.sampled_from([0.0, -math.log(7), 1.5]),
    )


@given(sigmoid_problems(dtypes=(torch.float64,), max_len=40), st.sampled_from([1, 3, 8]))
def test_chunked_with_many_tiles_agrees_float64(problem, block):
    """Small blocks: many query and key tiles, partial last tiles, tiles skipped above the
    causal diagonal; outputs and the gradients of q, k and v."""
    chunked_small = functools.partial(chunked, block=block)
    assert_backends_agree(
        problem, "sigmoid", backends=[], kernels={"chunked": chunked_small},
        kernel_features=FEATURES | BOTTOM_RIGHT,
    )  # fmt: skip


@given(sigmoid_problems(block_sizes=(BLOCK,)))
def test_registered_backends_agree_float32(problem):
    assert assert_backends_agree(problem, "sigmoid") == {"naive": "ok", "chunked": "ok"}


@pytest.mark.parametrize(("n", "m"), [(1, 1), (1, 9), (9, 1), (BLOCK + 1, 2 * BLOCK + 1)])
@pytest.mark.parametrize("is_causal", [False, True, "bottom_right"])
def test_lengths_one_and_past_a_block_float64(n, m, is_causal):
    problem = SigmoidProblem(
        q_len=n, k_len=m, heads=4, kv_heads=2, mask="empty_rows", is_causal=is_causal,
        dtype=torch.float64, bias=-math.log(m), seed=n + m,
    )  # fmt: skip
    assert assert_backends_agree(problem, "sigmoid") == {"naive": "ok", "chunked": "ok"}


def test_a_float_masks_gradient_agrees_across_tiles():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 11, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.randn(2, 1, 11, 11, generator=gen, dtype=torch.float64)
    mask = mask.masked_fill(torch.rand(2, 1, 11, 11, generator=gen) < 0.3, float("-inf"))
    grads = []
    for kernel in ("naive", functools.partial(chunked, block=4)):
        leaf = mask.clone().requires_grad_(True)
        if kernel == "naive":
            out = sigmoid_attention(q, k, v, leaf, True, bias=-1.0, backend="naive")
        else:
            out = kernel(q, k, v, leaf, True, bias=-1.0)
        (grad,) = torch.autograd.grad(out.square().sum(), leaf)
        grads.append(grad)
    assert grads[0].shape == mask.shape
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)


def test_a_masked_key_contributes_nothing_and_an_empty_row_is_zero():
    q, k, v = (torch.randn(1, 1, 3, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    for backend in ("naive", "chunked"):
        out = sigmoid_attention(q, k, v, mask, bias=0.5, backend=backend)
        weights = torch.sigmoid(q[0, 0] @ k[0, 0].T / 2 + 0.5) * mask
        torch.testing.assert_close(out[0, 0], weights @ v[0, 0])
        assert torch.equal(out[0, 0, 1], torch.zeros(4, dtype=torch.float64))


def test_chunked_never_allocates_the_score_matrix():
    """Forward and backward at N = M = 4 blocks: the largest tensor is one tile's scores or
    the (N, d) inputs, never an (N, M) matrix."""
    n = 4 * BLOCK
    q, k, v = (torch.randn(1, 1, n, 8, requires_grad=True) for _ in range(3))

    def run(backend):
        out = sigmoid_attention(q, k, v, is_causal=True, backend=backend)
        out.sum().backward()

    assert largest_allocation(lambda: run("chunked")) <= BLOCK * BLOCK
    assert largest_allocation(lambda: run("naive")) >= n * n  # the probe sees the naive one


def test_bad_bias_is_named():
    q = torch.randn(1, 1, 2, 4)
    for bias in (float("inf"), "1", True):
        with pytest.raises(ValueError, match=r"^bias=.*must be a finite number"):
            sigmoid_attention(q, q, q, bias=bias)
    for bias in (float("nan"), "x"):
        with pytest.raises(ValueError, match=r"^bias=.*must be None"):
            az.build("sigmoid", d_model=8, n_heads=2, bias=bias)


def transcription(layer, x, bias=None, causal=False):
    """The paper's equations, written out: per head sigmoid(Q K^T / sqrt(d) + b) V, b = -log n
    by default, masked (future) weights 0; heads concatenated into Wo."""
    n, h = x.shape[1], layer.n_heads
    q, k, v = (rearrange(w(x), "b n (h d) -> b h n d", h=h) for w in (layer.wq, layer.wk, layer.wv))
    b = -math.log(n) if bias is None else bias
    weights = torch.sigmoid(
        einsum(q, k, "b h i d, b h j d -> b h i j") / math.sqrt(q.shape[-1]) + b
    )
    if causal:
        weights = weights * torch.ones(n, n).tril()
    heads = einsum(weights, v, "b h i j, b h j d -> b h i d")
    return layer.wo(rearrange(heads, "b h n d -> b n (h d)"))


@pytest.mark.parametrize("backend", ["naive", "chunked"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [None, -2.0])
def test_the_mechanism_is_the_papers_equations(backend, causal, bias):
    torch.manual_seed(0)
    layer = az.build("sigmoid", d_model=12, n_heads=3, bias=bias, backend=backend).double()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    torch.testing.assert_close(layer(x, is_causal=causal), transcription(layer, x, bias, causal))


@pytest.mark.parametrize("backend", ["naive", "chunked"])
@pytest.mark.parametrize("causal", [False, True])
def test_equals_triton_sigmoids_reference(backend, causal):
    """triton-sigmoid's pure-torch `sigmoid_attention_ref` (a third party's; its bias
    -log(n + 1e-6), float32 inside, inputs (B, N, H, d)) on the mechanism's q, k, v."""
    reference = package_file("triton_sigmoid", "sigmoid_reference.py").sigmoid_attention_ref
    torch.manual_seed(0)
    layer = az.build("sigmoid", d_model=12, n_heads=3, backend=backend).double()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    q, k, v = (rearrange(w(x), "b n (h d) -> b n h d", h=3) for w in (layer.wq, layer.wk, layer.wv))
    want = reference(q, k, v, causal=causal)
    want = layer.wo(rearrange(want, "b n h d -> b n (h d)"))
    torch.testing.assert_close(layer(x, is_causal=causal), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("is_causal", [False, True])
def test_grouped_kv_heads_and_a_fixed_bias_agree_at_every_block_edge(is_causal):
    """At every length where the chunked kernel's tiling changes (mechanism_lengths), with
    grouped kv heads and a fixed bias (the plain layer: tests/test_mechanism_contract.py)."""
    kwargs = dict(d_model=16, n_heads=4, n_kv_heads=2, bias=-1.0)
    report = assert_mechanism_backends_agree("sigmoid", kwargs, is_causal=is_causal)
    assert report == {"chunked": "ok", "naive": "ok"}


def test_only_a_fixed_bias_takes_a_cache():
    paper = az.build("sigmoid", d_model=8, n_heads=2)
    assert not paper.supports_cache
    with pytest.raises(ValueError, match=r"bias=None .* takes no cache.*fixed bias"):
        paper(torch.randn(1, 3, 8), is_causal=True, cache=LayerCache())
    assert az.build("sigmoid", d_model=8, n_heads=2, bias=-math.log(20)).supports_cache


@pytest.mark.parametrize("backend", ["naive", "chunked"])
@pytest.mark.parametrize("additive", [False, True])
def test_the_papers_bias_counts_the_keys_a_key_mask_keeps(backend, additive):
    """b = -log(n) with n the real keys of each batch entry (a key mask (B, 1, 1, M), boolean
    or 0 / -inf): a sequence of 8 padded by 5 on the right or on the left, causal or not,
    gives its outputs alone, float64 to 1e-12 (the padding counted, it was 13 keys); a mask
    per query keeps n = M, the call's keys: the outputs of the layer with bias -log 13."""
    torch.manual_seed(0)
    layer = az.build("sigmoid", d_model=12, n_heads=3, backend=backend).double()
    x = torch.randn(1, 8, 12, dtype=torch.float64)
    pad = torch.randn(1, 5, 12, dtype=torch.float64)
    batch = torch.cat([torch.cat([x, pad], 1), torch.cat([pad, x], 1)])  # right, left padded
    real = torch.tensor([[True] * 8 + [False] * 5, [False] * 5 + [True] * 8])
    mask = real.view(2, 1, 1, 13)
    if additive:
        mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, -math.inf)
    with torch.no_grad():
        for causal in (False, True):
            alone = layer(x, is_causal=causal)[0]
            padded = layer(batch, attn_mask=mask, is_causal=causal)[real.view(2, 13)]
            torch.testing.assert_close(padded, alone.repeat(2, 1), atol=1e-12, rtol=0)
        per_query = mask.expand(2, 1, 13, 13)
        fixed = copy.deepcopy(layer)
        fixed.bias = -math.log(13)
        torch.testing.assert_close(
            layer(batch, attn_mask=per_query), fixed(batch, attn_mask=per_query)
        )
