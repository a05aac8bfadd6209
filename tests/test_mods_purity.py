"""A mod is called once per tile in the forward, or declared pure (attn_zoo/kernels/softmax/
mods.py): chunked calls the mods again in backward, so it refuses a mod declaring pure = False
and a score mod capturing a tensor that requires grad (features impure_mod, mod_grad), and
`auto` picks naive, which serves both. Gradients against the float64 naive path (the captured
tensor's included): atol 1e-12, rtol 1e-10; torch.autograd.gradcheck where it is the question."""

import pytest
import torch

from attn_zoo.kernels.dispatch import UnsupportedCallError, explain
from attn_zoo.kernels.softmax import build_mod, softmax_attention
from attn_zoo.kernels.softmax.chunked import BLOCK
from attn_zoo.kernels.softmax.mods import captured_tensors

TIGHT = dict(atol=1e-12, rtol=1e-10)


def qkv(n=6, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, n, 8, generator=gen, dtype=dtype).requires_grad_() for _ in "qkv"]


def learned_bias(table):
    """A relative-position bias read from `table` (H, 2 reach + 1), captured in the closure."""
    reach = (table.shape[1] - 1) // 2

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, (q_idx - kv_idx).clamp(-reach, reach) + reach]

    return relative_bias


def grads(backend, mod, tensors):
    q, k, v, *rest = tensors
    out = softmax_attention(q, k, v, score_mod=mod, backend=backend)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    return torch.autograd.grad((out * weights).sum(), tensors)


def test_a_captured_learnable_tensor_gets_naives_gradient_under_auto():
    """The table got its gradient on naive and none on chunked, which `auto` picked."""
    table = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    mod = learned_bias(table)
    assert captured_tensors(mod) == [table]
    q, k, v = qkv()
    choices = explain(softmax_attention, q, k, v, score_mod=mod)
    assert [c.chosen for c in choices] == ["naive"]
    assert "mod_grad" in choices[0].refused["chunked"]
    want = grads("naive", mod, [q, k, v, table])
    for got, expected in zip(grads("auto", mod, [q, k, v, table]), want, strict=True):
        torch.testing.assert_close(got, expected, **TIGHT)
    assert torch.autograd.gradcheck(
        lambda t: softmax_attention(q, k, v, score_mod=learned_bias(t)), table
    )
    with pytest.raises(UnsupportedCallError, match=r"chunked: does not support mod_grad: it calls"
                       r" the score mod again in backward"):  # fmt: skip
        softmax_attention(q, k, v, score_mod=mod, backend="chunked")
    with torch.no_grad():  # no gradient to give: chunked serves it
        torch.testing.assert_close(softmax_attention(q, k, v, score_mod=mod, backend="chunked"),
                                   softmax_attention(q, k, v, score_mod=mod), **TIGHT)  # fmt: skip


SLOPES = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)


def global_slopes(score, b, h, q_idx, kv_idx):  # reads a module-level tensor, no closure
    return score - SLOPES[h] * (q_idx - kv_idx)


def test_tensors_read_from_globals_or_declared_count_too():
    def declared(score, b, h, q_idx, kv_idx):
        return score + lookup(h)

    table = torch.zeros(2, requires_grad=True)
    lookup = table.__getitem__  # a bound method of a tensor: declare what it reads
    declared.parameters = [table]
    module = torch.nn.Linear(1, 1)
    q, k, v = qkv()
    for mod, captured in [(global_slopes, [SLOPES]), (declared, [table]),
                          (module.forward, list(module.parameters()))]:  # fmt: skip
        assert captured_tensors(mod) == captured, mod
    want = grads("naive", global_slopes, [q, k, v, SLOPES])
    for got, expected in zip(grads("auto", global_slopes, [q, k, v, SLOPES]), want, strict=True):
        torch.testing.assert_close(got, expected, **TIGHT)


class Noisy:
    """A stateful, random score mod declaring it (pure = False): each call adds new noise,
    kept in `drawn` to build the reference."""

    pure = False
    __name__ = "noisy"

    def __init__(self):
        self.gen, self.drawn = torch.Generator().manual_seed(1), []

    def __call__(self, score, b, h, q_idx, kv_idx):
        self.drawn.append(torch.randn(score.shape, generator=self.gen, dtype=score.dtype))
        return score + self.drawn[-1]


def added(noise: torch.Tensor):
    """A pure score mod adding `noise` (B, H, N, M) at each position (indexed, so pointwise:
    a whole-shaped `score + noise` fails on a tile, and the pointwise check refuses it)."""

    def add_noise(score, b, h, q_idx, kv_idx):
        return score + noise[b, h, q_idx, kv_idx]

    return add_noise


def test_an_impure_mod_is_called_once_and_its_gradient_is_of_that_call():
    """chunked (auto's pick) called the mod again in each tile's backward: gradients of
    another draw (at N = 40, one tile, dq off by 2.0 where |dq| <= 0.8). Now naive serves it:
    one call per forward, the gradient that call's."""
    q, k, v = qkv(300, seed=3)
    noisy = Noisy()
    got = grads("auto", noisy, [q, k, v])
    assert len(noisy.drawn) == 1
    drawn = noisy.drawn[0]
    want = grads("naive", added(drawn), [q, k, v])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **TIGHT)
    with pytest.raises(UnsupportedCallError, match="chunked: does not support impure_mod"):
        softmax_attention(q, k, v, score_mod=noisy, backend="chunked")
    with torch.no_grad():  # no backward: chunked calls it once per tile, the forward's only
        noisy.drawn.clear()
        got = softmax_attention(q, k, v, score_mod=noisy, backend="chunked")
        assert len(noisy.drawn) == 4  # N = 300: 2 x 2 tiles of 256
        tiles = torch.cat([torch.cat(noisy.drawn[:2], -1), torch.cat(noisy.drawn[2:], -1)], -2)
        want = softmax_attention(q, k, v, score_mod=added(tiles), backend="naive")
        torch.testing.assert_close(got, want, **TIGHT)


@pytest.mark.parametrize("backend", ["naive", "chunked", "auto"])
def test_an_undeclared_impure_mod_is_refused_before_it_is_served(backend):
    """A random mask mod that does not declare pure = False: the pointwise check calls it
    twice on its probe and refuses it by name (before: chunked served its forward, and a
    no-grad call, with no backward to check, gave another draw per tile)."""
    gen = torch.Generator().manual_seed(0)

    def random_mask(b, h, q_idx, kv_idx):
        return torch.rand(q_idx.shape[2], kv_idx.shape[3], generator=gen)[None, None] < 0.5

    q, k, v = qkv(40, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"mask_mod random_mask is impure without declaring it"
                       r".*random_mask.pure = False"):  # fmt: skip
        softmax_attention(q, k, v, mask_mod=random_mask, backend=backend)


def test_a_mod_changed_between_forward_and_backward_is_an_error_on_chunked():
    """A mod reading an object's attribute, changed after the forward: chunked's backward sees
    that the weights it recomputes no longer sum to 1 and raises, instead of the changed mod's
    dq."""

    class Setting:
        width = 20  # a partial tile: backward calls the mod again

    setting = Setting()

    def window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < setting.width

    q, k, v = qkv(40, dtype=torch.float32)
    out = softmax_attention(q, k, v, mask_mod=window, backend="chunked")
    setting.width = 3
    with pytest.raises(RuntimeError, match=r"a score or mask mod gave other scores when called "
                       r"again in backward.*must declare it \(mod.pure = False\)"):  # fmt: skip
        out.sum().backward()


@pytest.mark.parametrize("mods", [{}, {"score_mod": build_mod({"name": "softcap", "cap": 2.0})}])
def test_chunked_recomputes_the_forwards_scores_under_autocast(mods):
    """Under autocast (a grid's bf16 precision) chunked's forward ran its einsums in bfloat16
    and its backward, outside autocast, in float32: gradients of other weights than the
    forward's (with a mod, the recomputed rows summed to 1 +- 2e-3 and backward raised). Both
    passes are float32 now: the float32 tolerances of the float64 reference hold."""
    q, k, v = (t.detach().float().requires_grad_() for t in qkv(BLOCK + 7, seed=5))
    want = grads("naive", mods.get("score_mod"), [t.detach().double().requires_grad_()
                                                  for t in (q, k, v)])  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = softmax_attention(q, k, v, backend="chunked", **mods)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w, atol=1e-5, rtol=1e-4)
