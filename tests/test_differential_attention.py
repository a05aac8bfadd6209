"""Differential attention (Ye et al. 2024): the mechanism against a transcription of the
official code (microsoft/unilm Diff-Transformer/multihead_diffattn.py, not an installable
package), lambda_init by depth in every model, every softmax backend, maps, errors."""

import math

import pytest
import torch
import torch.nn.functional as F

import attn_zoo as az
from attn_zoo.kernels.rotary import Rotary, rotary_tables
from attn_zoo.maps import record_attention_maps
from attn_zoo.mechanisms.differential import lambda_init
from attn_zoo.models import LanguageModel
from attn_zoo.testing import assert_mechanism_backends_agree


def official(layer, x, attn_mask=None, rope=None):
    """The official forward, transcribed step by step in its own layout: q, k as (B, N, 2H, d),
    v as (B, N, Hkv, 2d), kv heads repeated (repeat_kv), an additive causal mask unless one is
    given, lambda_full = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init, subln an RMSNorm of width
    2d, (1 - lambda_init), out_proj. `rope` is applied as our Rotary does it."""
    bsz, n, _ = x.shape
    h, hkv, d = layer.n_heads, layer.n_kv_heads, layer.head_dim
    n_rep = h // hkv
    q = layer.wq(x).view(bsz, n, 2 * h, d)
    k = layer.wk(x).view(bsz, n, 2 * hkv, d)
    v = layer.wv(x).view(bsz, n, hkv, 2 * d)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if rope is not None:
        q, k = rope.apply(q), rope.apply(k)
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    weights = (q * d**-0.5) @ k.transpose(-1, -2)
    if attn_mask is None:
        attn_mask = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype), 1)
    weights = F.softmax(weights + attn_mask, dim=-1)
    lambda_1 = torch.exp(torch.sum(layer.lambda_q1 * layer.lambda_k1, dim=-1))
    lambda_2 = torch.exp(torch.sum(layer.lambda_q2 * layer.lambda_k2, dim=-1))
    lambda_full = lambda_1 - lambda_2 + layer.lambda_init
    weights = weights.view(bsz, h, 2, n, n)
    weights = weights[:, :, 0] - lambda_full * weights[:, :, 1]
    attn = weights @ v
    attn = attn * torch.rsqrt(attn.square().mean(-1, keepdim=True) + 1e-5) * layer.norm.weight
    attn = attn * (1 - layer.lambda_init)
    return layer.wo(attn.transpose(1, 2).reshape(bsz, n, h * 2 * d))


def perturbed(layer):
    """`layer` in float64 with every parameter moved off its initial value."""
    torch.manual_seed(1)
    layer = layer.double()
    for p in layer.parameters():
        p.data += 0.1 * torch.randn_like(p)
    return layer


@pytest.mark.parametrize("backend", ["naive", "chunked", "sdpa"])
@pytest.mark.parametrize("kwargs", [dict(n_heads=2), dict(n_heads=4, n_kv_heads=2, layer=5)])
def test_equals_the_official_code(backend, kwargs):
    torch.manual_seed(0)
    layer = perturbed(az.build("differential", d_model=16, backend=backend, **kwargs))
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    rope = Rotary(*(t.double() for t in rotary_tables(layer.head_dim, 7)))
    torch.testing.assert_close(layer(x, is_causal=True), official(layer, x))
    torch.testing.assert_close(layer(x, is_causal=True, rope=rope), official(layer, x, rope=rope))
    mask = torch.randn(2, kwargs["n_heads"], 7, 7, dtype=torch.float64)  # one per head
    torch.testing.assert_close(
        layer(x, attn_mask=mask), official(layer, x, mask.repeat_interleave(2, dim=1))
    )


def test_lambda_init_follows_the_paper_and_each_block_gets_its_depth():
    assert lambda_init(1) == pytest.approx(0.2)
    assert lambda_init(4) == pytest.approx(0.8 - 0.6 * math.exp(-0.9))
    model = LanguageModel(11, 16, 3, attention="differential", attention_kwargs=dict(n_heads=2))
    assert [b.attn.layer for b in model.blocks] == [1, 2, 3]
    assert [b.attn.lambda_init for b in model.blocks] == [lambda_init(n) for n in (1, 2, 3)]
    fixed = LanguageModel(11, 16, 2, attention="differential",
                          attention_kwargs=dict(n_heads=2, layer=6))  # fmt: skip
    assert [b.attn.layer for b in fixed.blocks] == [6, 6]  # set by the caller: kept


def test_every_softmax_backend_agrees():
    """At N = 9 and past the chunked kernel's block (N = 257), causal, with grouped kv heads."""
    kwargs = dict(d_model=16, n_heads=4, n_kv_heads=2)
    for n in (9, 257):
        report = assert_mechanism_backends_agree("differential", kwargs, length=n, is_causal=True)
        assert {b for b, status in report.items() if status == "ok"} >= {"naive", "chunked", "sdpa"}


def test_the_maps_are_the_difference_of_two_softmax_maps():
    """Each row of a differential map sums to 1 - lambda (two softmax rows, each summing to 1),
    and the maps times the values are the heads before their norm."""
    torch.manual_seed(0)
    model = LanguageModel(11, 16, 2, attention="differential", attention_kwargs=dict(n_heads=2))
    model = model.double()
    idx = torch.randint(0, 11, (2, 6))
    maps = record_attention_maps(model, idx)
    for i, block in enumerate(model.blocks):
        diff = maps[f"blocks.{i}.attn"]["attention"]
        assert diff.shape == (2, 2, 6, 6)
        lam = float(block.attn.lambda_full().detach())
        torch.testing.assert_close(diff.sum(-1), torch.full((2, 2, 6), 1 - lam, dtype=diff.dtype))
        assert torch.all(diff.triu(1) == 0)  # causal


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(d_model=12, n_heads=4), r"d_model=12 must be divisible by 2 \* n_heads = 8"),
        (dict(d_model=16, n_heads=2, layer=0), r"^layer=0: must be an integer >= 1"),
        (dict(d_model=16, n_heads=4, n_kv_heads=3), r"n_kv_heads=3 must divide n_heads=4"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        az.build("differential", **kwargs)
