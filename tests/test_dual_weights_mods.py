"""Paths that bypass standard attention's forward honour the layer's score and mask mods, or
refuse them: dual attention's need_weights path (attn_zoo/mechanisms/dual.py: it ignored the
self-attention branch's mods and their causality, an output 0.37 off with a sliding window) and
the example plugin (examples/sliding_window.py: it took score_mod and mask_mod and ignored
them); and they check their call as the forward's kernel does (an integer 0/1 mask, as Hugging
Face writes them, was taken as an additive one by the materialised paths: padded keys weighted,
and dual's need_weights output 0.07 off the output of need_weights=False, which refuses it)."""

import pytest
import torch

import attn_zoo as az

TIGHT = dict(atol=1e-12, rtol=1e-10)
SA_KWARGS = {
    "no mod": {},
    "sliding_window": {"mask_mod": {"name": "sliding_window", "window": 2}},
    "alibi": {"score_mod": "alibi"},
    "prefix_lm": {"mask_mod": {"name": "prefix_lm", "prefix": 3}},
}


CASES = [(m, c) for m in SA_KWARGS for c in (True, False) if c or m != "alibi"]  # ALiBi: below


@pytest.mark.parametrize(("mods", "is_causal"), CASES)
def test_dual_attentions_weights_path_applies_the_self_attention_mods(mods, is_causal):
    torch.manual_seed(0)
    layer = az.build("dual", d_model=16, n_heads_sa=2, n_heads_ra=2, backend="naive",
                     sa_kwargs=SA_KWARGS[mods]).double().eval()  # fmt: skip
    x, s = torch.randn(2, 7, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    plain = layer(x, s, is_causal=is_causal)
    layer.returns = "reference"
    out, weights, _ = layer(x, s, is_causal=is_causal, need_weights=True)
    torch.testing.assert_close(out, plain, **TIGHT)
    sa = layer.self_attention
    q, k = sa.queries_keys(x, x, None)
    scores = q @ k.transpose(-1, -2) * sa.head_dim**-0.5
    idx = torch.arange(7)
    b, h = torch.arange(2).view(2, 1, 1, 1), torch.arange(2).view(1, 2, 1, 1)
    i, j = idx.view(1, 1, 7, 1), idx.view(1, 1, 1, 7)
    if sa.score_mod is not None:
        scores = sa.score_mod(scores, b, h, i, j)
    allowed = torch.ones(7, 7, dtype=torch.bool)
    if is_causal and not getattr(sa.mask_mod, "replaces_causal", False):
        allowed = j <= i
    if sa.mask_mod is not None:
        allowed = allowed & sa.mask_mod(b, h, i, j)
    want = scores.masked_fill(~allowed, -torch.inf).softmax(-1)
    torch.testing.assert_close(weights, want, **TIGHT)


def test_dual_attentions_weights_path_refuses_one_sided_alibi_without_causality():
    layer = az.build("dual", d_model=16, n_heads_sa=2, n_heads_ra=2,
                     sa_kwargs={"score_mod": "alibi"})  # fmt: skip
    layer.returns = "reference"
    x = torch.randn(1, 5, 16)
    for need_weights in (False, True):
        with pytest.raises(ValueError, match="for causal attention only"):
            layer(x, x, need_weights=need_weights)


@pytest.mark.parametrize("argument", ["score_mod", "mask_mod"])
def test_the_example_plugin_refuses_mods_it_would_ignore(argument, example_plugin):
    spec = "alibi" if argument == "score_mod" else {"name": "sliding_window", "window": 2}
    with pytest.raises(ValueError, match=argument):
        az.build("sliding_window", d_model=16, n_heads=2, window=3, **{argument: spec})
    layer = az.build("sliding_window", d_model=16, n_heads=2, window=3, backend="naive")
    assert layer(torch.randn(1, 5, 16), is_causal=True).shape == (1, 5, 16)


SYMBOL_KWARGS = dict(
    symbol_retrieval="symbolic_attention", symbol_retrieval_kwargs=dict(n_symbols=4, n_heads=2)
)


def dual_weights(x, attn_mask):
    layer = az.build("dual", d_model=16, n_heads_sa=2, n_heads_ra=0).eval()
    layer.returns = "reference"
    return layer(x, attn_mask=attn_mask, need_weights=True)


def relational_reference_in_training(x, attn_mask):  # dropout: the output from the maps
    layer = az.build("relational", d_model=16, n_heads=2, dropout=0.5, **SYMBOL_KWARGS)
    layer.returns = "reference"
    return layer(x, attn_mask=attn_mask)


MATERIALISED = {
    "standard maps": lambda x, m: az.build("standard", d_model=16, n_heads=2).attention_maps(
        x, attn_mask=m
    ),
    "differential maps": lambda x, m: az.build(
        "differential", d_model=16, n_heads=2
    ).attention_maps(x, attn_mask=m),
    "relational maps": lambda x, m: az.build(
        "relational", d_model=16, n_heads=2, **SYMBOL_KWARGS
    ).attention_maps(x, attn_mask=m),
    "dual need_weights": dual_weights,
    "relational reference in training": relational_reference_in_training,
}


@pytest.mark.parametrize("path", MATERIALISED)
def test_materialised_paths_refuse_an_integer_mask_as_the_forward_does(path):
    torch.manual_seed(0)
    x = torch.randn(1, 4, 16)
    keep = torch.tensor([0, 1, 1, 1]).view(1, 1, 1, 4)  # key 0 is padding, 1 = attend
    MATERIALISED[path](x, keep.bool())  # a boolean mask is served
    with pytest.raises(ValueError, match="attn_mask must be boolean .* got torch.int64"):
        MATERIALISED[path](x, keep)
