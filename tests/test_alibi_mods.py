"""ALiBi (Press, Smith and Lewis, "Train Short, Test Long", ICLR 2022) as the `alibi` score mod:
the authors' slopes for every head count, in the score's dtype; for causal attention only
(a standard layer refuses it in a call that is not causal, naming the symmetric variant);
the bare name builds in a layer. Float64 comparisons: atol 1e-12, rtol 1e-12; the slopes to
rtol 1e-14 (the paper's powers of a rounded start against exp2: up to 33 roundings)."""

import math

import pytest
import torch

import attn_zoo as az
from attn_zoo.kernels.softmax import build_mod, softmax_attention
from attn_zoo.kernels.softmax.chunked import BLOCK
from attn_zoo.models import SequenceClassifier

TIGHT = dict(atol=1e-12, rtol=1e-12)


def paper_slopes(n: int) -> list[float]:
    """The paper's slopes, in Python floats (float64), from its definition: for a power of two
    n, the geometric sequence starting at 2^(-8/n) with that ratio; otherwise the slopes of
    the closest power of two below n, followed by every other slope of twice that many heads
    (the odd-numbered ones) until there are n."""
    if n & (n - 1) == 0:
        start = 2.0 ** (-8.0 / n)
        return [start**i for i in range(1, n + 1)]
    below = 2 ** math.floor(math.log2(n))
    return paper_slopes(below) + paper_slopes(2 * below)[0::2][: n - below]


def slopes_of(mod, heads: int, dtype=torch.float64) -> torch.Tensor:
    """The slopes the mod applies: minus its bias one position back (i - j = 1), per head."""
    score = torch.zeros(1, heads, 1, 1, dtype=dtype)
    h, one, zero = torch.arange(heads).view(1, heads, 1, 1), torch.ones(1, 1, 1, 1), 0
    return -mod(score, 0, h, one.long(), torch.zeros(1, 1, 1, 1).long() + zero).flatten()


@pytest.mark.parametrize("heads", list(range(1, 34)))
def test_the_slopes_are_the_authors_for_every_head_count_in_float64(heads):
    """Ours were 2^(-8 h / H) for every H: for 6 heads 0.397 .. 0.0039, the authors' 0.25,
    0.0625, 0.0156, 0.0039, 0.5, 0.125 (BLOOM's and Megatron's too); and float32 slopes for
    float64 scores (2.6e-8 off at 6 heads)."""
    want = torch.tensor(paper_slopes(heads), dtype=torch.float64)
    got = slopes_of(build_mod({"name": "alibi", "n_heads": heads}), heads)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=0, rtol=1e-14)
    float32 = slopes_of(build_mod({"name": "alibi", "n_heads": heads}), heads, torch.float32)
    torch.testing.assert_close(float32, want.float())  # a float32 score: float32 slopes


def test_six_heads_measured():
    got = slopes_of(build_mod({"name": "alibi", "n_heads": 6}), 6)
    assert got.tolist() == [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]


def test_the_bare_name_builds_in_a_layer_and_is_refused_with_the_table_form_elsewhere():
    """``score_mod = "alibi"`` was a bare TypeError (alibi() missing n_heads)."""
    torch.manual_seed(0)
    bare = az.build("standard", d_model=12, n_heads=6, score_mod="alibi").double()
    table = az.build("standard", d_model=12, n_heads=6, score_mod={"name": "alibi"}).double()
    table.load_state_dict(bare.state_dict())
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    torch.testing.assert_close(bare(x, is_causal=True), table(x, is_causal=True), **TIGHT)
    with pytest.raises(ValueError, match=r"^mod 'alibi' needs n_heads: name it in a table "
                       r'\{ name = "alibi", n_heads = \.\.\. \}$'):  # fmt: skip
        build_mod("alibi")
    with pytest.raises(ValueError, match=r"^mod 'softcap' needs cap"):
        az.build("standard", d_model=16, n_heads=2, score_mod="softcap")


def mean_position_of_query_zero(mod, n: int, heads: int) -> torch.Tensor:
    """Where query 0 of n attends on average, per head, when every score is equal."""
    q, k = (torch.zeros(1, heads, n, 4, dtype=torch.float64) for _ in "qk")
    v = torch.arange(n, dtype=torch.float64).view(1, 1, n, 1).expand(1, heads, n, 1)
    return softmax_attention(q, k, v, score_mod=mod)[0, :, 0, 0]


def test_without_causality_alibi_is_refused_naming_the_symmetric_variant():
    """With equal scores, query 0 of 32 attended at mean position 29.5 (head 0 of 8, slope
    1/2: -slope (0 - j) grows with j, later keys win); an encoder took it. The symmetric bias
    keeps it at 1.54 (near itself)."""
    one_sided = build_mod({"name": "alibi", "n_heads": 8})
    assert mean_position_of_query_zero(one_sided, 32, 8)[0].item() == pytest.approx(29.46, abs=0.01)
    symmetric = build_mod({"name": "alibi", "n_heads": 8, "symmetric": True})
    assert mean_position_of_query_zero(symmetric, 32, 8)[0].item() == pytest.approx(1.54, abs=0.01)
    refusal = (r"score_mod alibi_bias is for causal attention only, and this call is not causal"
               r".*symmetric bias -slope \|i - j\|: score_mod = \{ name = \"alibi\", symmetric "
               r"= true \}")  # fmt: skip
    layer = az.build("standard", d_model=16, n_heads=4, score_mod="alibi")
    x = torch.randn(1, 5, 16)
    with pytest.raises(ValueError, match=refusal):
        layer(x)
    with pytest.raises(ValueError, match=refusal):
        layer.attention_maps(x)
    encoder = SequenceClassifier(11, 3, 16, attention="standard",
                                 attention_kwargs={"n_heads": 4, "score_mod": "alibi"})  # fmt: skip
    with pytest.raises(ValueError, match=refusal):
        encoder(torch.randint(0, 11, (2, 5)))
    symmetric = {"n_heads": 4, "score_mod": {"name": "alibi", "symmetric": True}}
    encoder = SequenceClassifier(11, 3, 16, attention="standard", attention_kwargs=symmetric)
    assert encoder(torch.randint(0, 11, (2, 5)))[0].isfinite().all()


@pytest.mark.parametrize("backend", ["naive", "chunked"])
def test_symmetric_alibi_is_minus_slope_times_the_distance_and_causal_alibi_under_causality(
    backend,
):
    n, heads = BLOCK + 5, 6
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, 8, generator=gen, dtype=torch.float64) for _ in "qkv")
    slopes = torch.tensor(paper_slopes(heads), dtype=torch.float64).view(heads, 1, 1)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    symmetric = build_mod({"name": "alibi", "n_heads": heads, "symmetric": True})
    one_sided = build_mod({"name": "alibi", "n_heads": heads})
    want = softmax_attention(q, k, v, attn_mask=-slopes * (i - j).abs(), backend="naive")
    torch.testing.assert_close(
        softmax_attention(q, k, v, score_mod=symmetric, backend=backend), want, **TIGHT
    )
    for mod in (symmetric, one_sided):  # the same bias where j <= i
        got = softmax_attention(q, k, v, score_mod=mod, is_causal=True, backend=backend)
        want = softmax_attention(q, k, v, attn_mask=-slopes * (i - j), is_causal=True)
        torch.testing.assert_close(got, want, **TIGHT)


def test_bad_symmetric_is_named():
    with pytest.raises(ValueError, match=r"^symmetric='yes': must be true or false"):
        build_mod({"name": "alibi", "n_heads": 2, "symmetric": "yes"})
