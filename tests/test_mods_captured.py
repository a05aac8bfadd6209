"""A score mod's learnable tensor found however the mod reaches it (attn_zoo/kernels/softmax/
mods.py, `captured_tensors`): a default argument, a functools.partial's keyword, a callable
instance's attribute, a global object's attribute, a global helper function, a global class's
attribute or classmethod, a global module's attribute; and, by calling the mod
(`reads_learnable`), a tensor deep in a global, in a deque, or a class attribute read through
an instance. Each was missed: `auto` picked chunked and the tensor got no gradient (naive gives
it one). Now each makes a ``mod_grad`` call, served by naive: gradients against the float64
naive path, atol 1e-12, rtol 1e-10. A captured float is keyed by its bits (`mod_key`)."""

import collections
import functools
import math
import types

import pytest
import torch

from attn_zoo.kernels.dispatch import explain
from attn_zoo.kernels.softmax import describe_call, softmax_attention
from attn_zoo.kernels.softmax.mods import captured_tensors, mod_key

TIGHT = dict(atol=1e-12, rtol=1e-10)
H = 2


def qkv(n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, n, 8, generator=gen, dtype=torch.float64).requires_grad_()
            for _ in "qkv"]  # fmt: skip


def learnable():
    return torch.tensor([0.5, -0.25], dtype=torch.float64).view(H, 1, 1).requires_grad_()


def biased(score, b, h, q_idx, kv_idx, bias):
    return score + bias[h.view(-1)].view(1, H, 1, 1) * (q_idx - kv_idx)


def default_argument_mod(bias):
    def default_argument(score, b, h, q_idx, kv_idx, bias=bias):
        return biased(score, b, h, q_idx, kv_idx, bias)

    return default_argument


def keyword_only_default_mod(bias):
    def keyword_only_default(score, b, h, q_idx, kv_idx, *, bias=bias):
        return biased(score, b, h, q_idx, kv_idx, bias)

    return keyword_only_default


class CallableMod:
    def __init__(self, bias):
        self.bias = bias

    def __call__(self, score, b, h, q_idx, kv_idx):
        return biased(score, b, h, q_idx, kv_idx, self.bias)


HOLDER = types.SimpleNamespace(settings=types.SimpleNamespace(bias=None))


def global_attribute(score, b, h, q_idx, kv_idx):  # a global object's attribute's attribute
    return biased(score, b, h, q_idx, kv_idx, HOLDER.settings.bias)


def global_attribute_mod(bias):
    HOLDER.settings.bias = bias
    return global_attribute


_BIAS = [None]


def _current_bias():  # a global helper function the mod calls
    return _BIAS[0]


def global_helper(score, b, h, q_idx, kv_idx):
    return biased(score, b, h, q_idx, kv_idx, _current_bias())


def global_helper_mod(bias):
    _BIAS[0] = bias
    return global_helper


class Settings:  # a global class: an attribute and a classmethod the mod reads
    bias = None

    @classmethod
    def current(cls):
        return cls.bias


def class_attribute(score, b, h, q_idx, kv_idx):
    return biased(score, b, h, q_idx, kv_idx, Settings.bias)


def class_method(score, b, h, q_idx, kv_idx):
    return biased(score, b, h, q_idx, kv_idx, Settings.current())


def settings_mod(mod):
    def form(bias):
        Settings.bias = bias
        return mod

    return form


SETTINGS = types.ModuleType("user_settings")  # a global module object (a user's settings file)
SETTINGS.__file__ = __file__


def module_attribute(score, b, h, q_idx, kv_idx):
    return biased(score, b, h, q_idx, kv_idx, SETTINGS.bias)


def module_attribute_mod(bias):
    SETTINGS.bias = bias
    return module_attribute


FORMS = {
    "default_argument": default_argument_mod,
    "keyword_only_default": keyword_only_default_mod,
    "partial": lambda bias: functools.partial(biased, bias=bias),
    "partial_positional": lambda bias: functools.partial(
        lambda bias, score, b, h, q_idx, kv_idx: biased(score, b, h, q_idx, kv_idx, bias), bias
    ),
    "callable_instance": CallableMod,
    "global_attribute": global_attribute_mod,
    "global_helper": global_helper_mod,
    "class_attribute": settings_mod(class_attribute),
    "class_method": settings_mod(class_method),
    "module_attribute": module_attribute_mod,
}


CFG = {"a": {"b": {"bias": None}}}  # a global three steps deep


def deep_global(score, b, h, q_idx, kv_idx):
    return biased(score, b, h, q_idx, kv_idx, CFG["a"]["b"]["bias"])


def deep_global_mod(bias):
    CFG["a"]["b"]["bias"] = bias
    return deep_global


def deque_mod(bias):
    held = collections.deque([bias])  # a container the walk does not open

    def from_deque(score, b, h, q_idx, kv_idx):
        return biased(score, b, h, q_idx, kv_idx, held[0])

    return from_deque


class Config:
    bias = None  # a class attribute, read through an instance


def instance_class_attribute_mod(bias):
    Config.bias = bias
    config = Config()

    def through_instance(score, b, h, q_idx, kv_idx):
        return biased(score, b, h, q_idx, kv_idx, config.bias)

    return through_instance


PROBED = {  # what the walk of `captured_tensors` misses and calling the mod finds
    "deep_global": deep_global_mod,
    "deque": deque_mod,
    "instance_class_attribute": instance_class_attribute_mod,
}


def grads(backend, mod, tensors):
    q, k, v, *_ = tensors
    out = softmax_attention(q, k, v, is_causal=True, score_mod=mod, backend=backend)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    return torch.autograd.grad((out * weights).sum(), tensors, allow_unused=True)


@pytest.mark.parametrize("form", [*FORMS, *PROBED])
def test_a_learnable_tensor_the_mod_reaches_gets_naives_gradient_under_auto(form):
    """It got none under auto (chunked, picked as if the mod captured nothing)."""
    bias = learnable()
    mod = {**FORMS, **PROBED}[form](bias)
    assert any(t is bias for t in captured_tensors(mod)) == (form in FORMS)
    q, k, v = qkv()
    assert "mod_grad" in describe_call(q, k, v, is_causal=True, score_mod=mod).features
    assert [c.chosen for c in explain(softmax_attention, q, k, v, is_causal=True,
                                      score_mod=mod)] == ["naive"]  # fmt: skip
    want = grads("naive", mod, [q, k, v, bias])
    got = grads("auto", mod, [q, k, v, bias])
    assert got[-1] is not None and want[-1].abs().sum() > 0
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **TIGHT)


def test_the_brief_repro_gives_the_default_argument_its_gradient():
    torch.manual_seed(0)
    heads = 4
    q, k, v = (torch.randn(1, heads, 6, 16, requires_grad=True) for _ in range(3))
    bias = torch.zeros(heads, 1, 1, requires_grad=True)

    def sm(s, b, h, i, j, bias=bias):
        return s + bias[h.view(-1)].view(1, heads, 1, 1) * (i - j)

    softmax_attention(q, k, v, score_mod=sm, is_causal=True).sum().backward()
    assert bias.grad is not None and bias.grad.abs().sum() > 0


def test_module_parameters_and_attributes_count_and_no_grad_tensors_change_nothing():
    layer = torch.nn.Linear(1, 1)
    holder = types.SimpleNamespace(layer=layer, table=learnable(), name="x")
    mod = functools.partial(biased, bias=holder)  # an object reached through a partial
    found = captured_tensors(mod)
    assert {id(t) for t in found} == {id(t) for t in [*layer.parameters(), holder.table]}
    cycle = types.SimpleNamespace()
    cycle.self = cycle  # a cycle ends
    cycle.bias = torch.zeros(H, 1, 1)  # requires no grad: chunked still serves the call
    mod = CallableMod(cycle)
    assert [t is cycle.bias for t in captured_tensors(mod)] == [True]
    q, k, v = qkv()
    assert "mod_grad" not in describe_call(q, k, v, is_causal=True, score_mod=mod).features


class Opaque:
    """A callable whose code is not Python (here: a C slot), so its tensors cannot be seen."""

    __call__ = torch.Tensor.__add__


def test_a_callable_whose_code_cannot_be_read_is_taken_as_capturing_a_learnable_tensor():
    q, k, v = qkv()
    mod = Opaque()
    assert "mod_grad" in describe_call(q, k, v, score_mod=mod).features
    mod.parameters = []  # it declares what it reads: trusted
    assert "mod_grad" not in describe_call(q, k, v, score_mod=mod).features


def captured_sign(sign: float):
    """A mask mod whose window is 200 ahead for sign 0.0 and 200 behind for -0.0."""

    def shifted_window(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + math.copysign(200, sign)

    return shifted_window


def test_a_captured_float_is_keyed_by_its_bits():
    """0.0 and -0.0 compare equal: keyed by value, the two mods shared a key and chunked
    reused the first one's block mask for the second (1.79 off naive); a NaN never equalled
    another NaN, so a mod capturing one had a key only its own NaN object matched."""
    assert mod_key(captured_sign(0.0), []) != mod_key(captured_sign(-0.0), [])
    assert mod_key(captured_sign(math.nan), []) == mod_key(captured_sign(float("nan")), [])
    assert mod_key(captured_sign(math.nan), []) != mod_key(captured_sign(-math.nan), [])
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 512, 8, generator=gen, dtype=torch.float64) for _ in "qkv")
    for sign in (0.0, -0.0):
        mod = captured_sign(sign)
        got = softmax_attention(q, k, v, mask_mod=mod, backend="chunked")
        want = softmax_attention(q, k, v, mask_mod=mod, backend="naive")
        torch.testing.assert_close(got, want, **TIGHT)
