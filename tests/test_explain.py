"""az.explain: which backend served each kernel call of a forward pass, and why others did not."""

import torch

import attn_zoo as az
from attn_zoo.kernels import recording_choices
from attn_zoo.kernels.softmax import softmax_attention


def test_explain_names_the_choice_and_the_refusals():
    m = az.build("relational", d_model=16, n_heads=2, symbol_retrieval="positional_symbols",
                 symbol_retrieval_kwargs=dict(max_length=8))  # fmt: skip
    x = torch.randn(1, 8, 16)
    (choice,) = az.explain(m, x, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    assert (choice.family, choice.asked) == ("relational", "auto")
    assert choice.chosen != "cpp" and "mask" in choice.call.features
    if "cpp" in choice.refused:  # where the C++ kernel builds, it is tried first and refused
        assert "takes no attn_mask" in choice.refused["cpp"]
        assert "skipped 'cpp'" in str(choice)
    (plain,) = az.explain(m, x, is_causal=True)
    assert plain.chosen == az.kernels.family("relational").select("auto", plain.call).name


def test_composite_mechanisms_report_one_choice_per_kernel_call():
    dual = az.build("dual", d_model=16, n_heads_sa=1, n_heads_ra=1)
    choices = az.explain(dual, torch.randn(1, 5, 16), symbols=torch.randn(1, 5, 16))
    assert [c.family for c in choices] == ["softmax", "relational"]


def test_recording_stops_with_the_block():
    q = torch.randn(1, 1, 3, 4)
    with recording_choices() as choices:
        softmax_attention(q, q, q, backend="naive")
    softmax_attention(q, q, q)
    assert [(c.asked, c.chosen) for c in choices] == [("naive", "naive")]
