"""Masks and causal alignment on every backend: boolean or additive float masks, causality
top-left (torch SDPA) or bottom-right (FlashAttention, KV-cache decoding)."""

import pytest
import torch

from attn_zoo.kernels.dispatch import Call, UnsupportedCallError, family
from attn_zoo.kernels.linear import linear_attention
from attn_zoo.kernels.relational import relational_attention
from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.testing import AttentionProblem, RelationalProblem

SOFTMAX_CPU = [
    name for name, b in family("softmax").backends.items() if "cpu" in b.capabilities.devices
]


def qkv(n: int, m: int, seed: int = 0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, length, 8, generator=gen, dtype=dtype) for length in (n, m, m)]


def reference(q, k, v, allowed=None, bias=None):
    """softmax(q k^T / sqrt(d) + bias) v over allowed keys, rows with no key zero."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v


@pytest.mark.parametrize("backend", SOFTMAX_CPU)
@pytest.mark.parametrize("n, m", [(1, 9), (3, 9), (9, 9), (9, 4)])
def test_bottom_right_causality_is_the_last_query_seeing_the_last_key(backend, n, m):
    q, k, v = qkv(n, m)
    allowed = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
    want = reference(q, k, v, allowed)
    got = softmax_attention(q, k, v, is_causal="bottom_right", backend=backend)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)
    top_left = softmax_attention(q, k, v, is_causal=True, backend=backend)
    if n != m:  # the two alignments differ exactly when the lengths do
        assert not torch.allclose(got, top_left)


@pytest.mark.parametrize("backend", SOFTMAX_CPU)
def test_an_additive_mask_is_added_to_the_scores(backend):
    q, k, v = qkv(5, 7, seed=1)
    bias = torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(2), dtype=q.dtype)
    bias[0, 0, 2] = float("-inf")  # a row that sees no key: zeros
    bias[1, 0, :, 3] = float("-inf")
    want = reference(q, k, v, bias=bias)
    got = softmax_attention(q, k, v, attn_mask=bias, backend=backend)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)
    assert (got[0, :, 2] == 0).all()


@pytest.mark.parametrize("backend", SOFTMAX_CPU)
def test_a_zero_minus_inf_float_mask_equals_its_boolean_mask(backend):
    q, k, v = (t.float() for t in qkv(6, 6, seed=3))
    allowed = torch.rand(1, 2, 6, 6, generator=torch.Generator().manual_seed(4)) < 0.6
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    for causal in (False, True, "bottom_right"):
        got = softmax_attention(q, k, v, attn_mask=additive, is_causal=causal, backend=backend)
        want = softmax_attention(q, k, v, attn_mask=allowed, is_causal=causal, backend=backend)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_relational_backends_take_float_masks_and_bottom_right_causality():
    problem = RelationalProblem(q_len=4, k_len=9, mask="additive", is_causal="bottom_right")
    x = problem.inputs(torch.float64)
    want = relational_attention(**x, backend="naive")
    got = relational_attention(**x, backend="chunked")
    torch.testing.assert_close(got, want)
    assert relational_attention(**{**x, "attn_mask": None}, backend="naive").shape == want.shape


def test_backends_that_take_no_float_mask_refuse_by_their_capabilities():
    x = RelationalProblem(q_len=5, k_len=5, mask="additive").inputs()
    with pytest.raises(UnsupportedCallError, match="'cpp'.*takes no attn_mask"):
        relational_attention(**x, backend="cpp")
    triton = family("relational").backends["triton"].capabilities
    assert "boolean masks only" in triton.refusal(Call("cuda", torch.float32, {"float_mask"}))


def test_linear_attention_reads_a_float_mask_by_its_minus_inf_entries():
    x = AttentionProblem(q_len=6, k_len=6, mask="additive").inputs(torch.float64)
    allowed = x["attn_mask"] > float("-inf")
    got = linear_attention(x["q"], x["k"], x["v"], attn_mask=x["attn_mask"])
    torch.testing.assert_close(got, linear_attention(x["q"], x["k"], x["v"], attn_mask=allowed))


def test_bad_causal_alignment_is_named():
    q, k, v = qkv(2, 2)
    with pytest.raises(ValueError, match="is_causal='bottom-right'.*bottom_right"):
        softmax_attention(q, k, v, is_causal="bottom-right")
