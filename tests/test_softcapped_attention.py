"""Softcapped attention (Gemma 2): standard attention with the softcap score mod, against
transformers' Gemma 2 attention function, on the backends that take a score mod."""

import re

import pytest
import torch
from einops import rearrange

import attn_zoo as az
from attn_zoo.kernels.dispatch import UnsupportedCallError, family
from attn_zoo.maps import record_attention_maps
from attn_zoo.models import LanguageModel


def heads(layer, x):
    q, k, v = (rearrange(w(x), "b n (h d) -> b h n d", d=layer.head_dim)
               for w in (layer.wq, layer.wk, layer.wv))  # fmt: skip
    return q, k, v


@pytest.mark.parametrize("backend", ["naive", "chunked"])
def test_equals_gemma2s_attention_in_transformers(backend):
    """transformers' Gemma 2 eager attention (softcap, then the additive mask, softmax in
    float32: float32 tolerances) on the layer's own q, k, v, grouped kv heads included."""
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    torch.manual_seed(0)
    layer = az.build("softcapped", d_model=16, n_heads=4, n_kv_heads=2, cap=1.5, backend=backend)
    layer = layer.double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    q, k, v = heads(layer, x)
    causal = torch.triu(torch.full((7, 7), float("-inf"), dtype=torch.float64), 1)
    module = torch.nn.Module()
    module.num_key_value_groups, module.head_dim = 2, layer.head_dim
    want, _ = gemma2.eager_attention_forward(module, q, k, v, causal, softcap=1.5,
                                             scaling=layer.head_dim**-0.5)  # fmt: skip
    want = layer.wo(rearrange(want, "b n h d -> b n (h d)"))
    torch.testing.assert_close(layer(x, is_causal=True), want, rtol=1e-5, atol=1e-6)


def test_it_is_standard_attention_with_the_softcap_mod():
    torch.manual_seed(0)
    capped = az.build("softcapped", d_model=16, n_heads=2, cap=2.0).double()
    standard = az.build(
        "standard", d_model=16, n_heads=2, score_mod={"name": "softcap", "cap": 2.0}
    )
    standard = standard.double()
    standard.load_state_dict(capped.state_dict())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.testing.assert_close(capped(x, is_causal=True), standard(x, is_causal=True))
    plain = az.build("standard", d_model=16, n_heads=2).double()
    plain.load_state_dict(capped.state_dict())
    assert not torch.allclose(capped(x), plain(x))  # a cap of 2 changes the scores
    huge = az.build("softcapped", d_model=16, n_heads=2, cap=1e8).double()
    huge.load_state_dict(capped.state_dict())
    torch.testing.assert_close(huge(x), plain(x))  # cap tanh(s / cap) -> s


def test_offers_only_the_backends_that_take_a_score_mod():
    softmax = family("softmax")
    backends = az.list_backends("softcapped")
    assert {"naive", "chunked"} <= set(backends) and "sdpa" not in backends
    for name in set(backends) & set(softmax.backends):
        assert "score_mod" in softmax.backends[name].capabilities.features, name
    with pytest.raises(ValueError, match=r"unknown backend for SoftcappedAttention: 'sdpa'"):
        az.build("softcapped", d_model=8, n_heads=2, backend="sdpa")


def test_backend_status_says_which_backends_serve_its_calls():
    """backend_status said the fused tier runs on CPU (it answered for a plain softmax call,
    which sdpa serves), yet every softcapped call has a score mod, which no CPU fused backend
    takes: every call failed. Now it answers for a call with the score mod."""
    x = torch.randn(1, 4, 8)
    for backend in ["auto", *az.list_backends("softcapped")]:
        ok, why = az.backend_status("softcapped", backend, "cpu")
        layer = az.build("softcapped", d_model=8, n_heads=2, backend=backend)
        if ok:
            assert layer(x).shape == x.shape, backend
        else:
            with pytest.raises(UnsupportedCallError):
                layer(x)
    ok, why = az.backend_status("softcapped", "fused", "cpu")
    assert not ok and "features ['score_mod']): sdpa: does not support score_mod" in why


def test_the_maps_are_those_of_the_pass():
    """The recorded maps times the values, through Wo, give the layer's output: the maps
    have the cap applied (standard attention's maps apply its score and mask mods)."""
    torch.manual_seed(0)
    model = LanguageModel(11, 16, 1, attention="softcapped",
                          attention_kwargs=dict(n_heads=2, cap=0.3)).double()  # fmt: skip
    recorded = record_attention_maps(model, torch.randint(0, 11, (2, 5)))
    assert recorded["blocks.0.attn"]["attention"].shape == (2, 2, 5, 5)
    layer, x = model.blocks[0].attn, torch.randn(2, 5, 16, dtype=torch.float64)
    maps = layer.attention_maps(x, is_causal=True)["attention"]
    _, _, v = heads(layer, x)
    out = layer.wo(rearrange(maps @ v, "b h n d -> b n (h d)"))
    torch.testing.assert_close(out, layer(x, is_causal=True))


def test_a_bad_cap_is_named():
    with pytest.raises(ValueError, match=r"^cap=0: must be a positive float"):
        az.build("softcapped", d_model=8, n_heads=2, cap=0)


@pytest.mark.parametrize("cap", [1e39, float("inf"), float("nan"), 1e-39, -1.0, True, "50"])
def test_a_cap_outside_float32s_range_is_refused_before_any_work(cap):
    """A cap of 1e39 was accepted and every output NaN (in float32 the cap is inf:
    inf * tanh(s / inf) = inf * 0); the scores are float32 or wider, so a cap is a positive
    float in float32's normal range."""
    message = re.escape(f"cap={cap!r}: must be a positive float in [1.175e-38, 3.403e+38] "
                        "(float32's normal range")  # fmt: skip
    with pytest.raises(ValueError, match=f"^{message}"):
        az.build("softcapped", d_model=8, n_heads=2, cap=cap)
    with pytest.raises(ValueError, match=f"^{message}"):
        az.build("standard", d_model=8, n_heads=2, score_mod={"name": "softcap", "cap": cap})


def test_the_largest_cap_leaves_float32_scores_as_they_are():
    torch.manual_seed(0)
    capped = az.build("softcapped", d_model=8, n_heads=2, cap=3.4e38)
    plain = az.build("standard", d_model=8, n_heads=2)
    plain.load_state_dict(capped.state_dict())
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(capped(x, is_causal=True), plain(x, is_causal=True))
