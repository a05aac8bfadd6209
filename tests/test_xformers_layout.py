"""xformers has no CPU kernels; its layout and mask conversions are checked here on CPU by
feeding them to a plain-torch reader of the xformers layout."""

import torch
from hypothesis import given

from attn_zoo.kernels.dispatch import family
from attn_zoo.kernels.softmax.naive import naive
from attn_zoo.kernels.softmax.xformers import CAUSAL, from_xformers_layout, xformers_inputs
from attn_zoo.testing import attention_problems, compare


def read_xformers_layout(q, k, v, bias, scale):
    """What memory_efficient_attention computes, in plain torch: softmax(q k^T s + bias) v."""
    scores = torch.einsum("bn...d,bm...d->b...nm", q, k) * scale
    if isinstance(bias, str):
        n, m = scores.shape[-2:]
        bias = torch.zeros(n, m, dtype=q.dtype).masked_fill(
            ~torch.ones(n, m, dtype=torch.bool).tril(), float("-inf")
        )
    if bias is not None:
        scores = scores + bias
    return torch.einsum("b...nm,bm...d->bn...d", torch.softmax(scores, dim=-1), v)


@given(
    attention_problems(dtypes=(torch.float64,), masks=("none", "random", "key_padding", "additive"))
)
def test_conversions_reproduce_the_reference(problem):
    softmax = family("softmax")
    features = softmax.backends["xformers"].capabilities.features
    x = softmax.backend_inputs(softmax.check(**problem.inputs()), features)  # as xformers gets it
    scale = problem.scale or problem.key_dim**-0.5
    xq, xk, xv, bias, has_key = xformers_inputs(
        x["q"], x["k"], x["v"], x["attn_mask"], x["is_causal"]
    )
    assert xq.shape[1] == problem.q_len and xk.shape[1] == problem.k_len
    if bias is not None and not isinstance(bias, str):
        assert bias.untyped_storage().nbytes() // bias.element_size() % 8 == 0  # aligned storage
    if x["is_causal"] and x["attn_mask"] is None:
        assert bias == CAUSAL
    out = from_xformers_layout(read_xformers_layout(xq, xk, xv, bias, scale))
    if has_key is not None:
        out = out * has_key
    want = naive(**x)
    assert compare("output", out, want, 1e-10, 1e-8).ok
