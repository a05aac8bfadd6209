"""The kernel backend registry refuses a taken name, as every registry does (the mechanism
registry's message), unless the replacement is explicit (replace=True), which is recorded with
every registry's replacements (attn_zoo.registry.replaced_names) for a cell's environment."""

import pytest
import torch

import attn_zoo.registry
from attn_zoo.kernels.dispatch import Capabilities, family, register_backend
from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.kernels.softmax.family import FEATURES, MODS
from attn_zoo.kernels.softmax.naive import naive


def doubled(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0,
            score_mod=None, mask_mod=None):  # fmt: skip
    return 2 * naive(q, k, v, attn_mask, is_causal, scale, dropout_p, score_mod, mask_mod)


def test_a_taken_backend_name_is_refused_unless_replaced_explicitly(
    restore_registries, monkeypatch
):
    """`register_backend("softmax", "naive", ...)` silently replaced the ground truth."""
    monkeypatch.setattr(attn_zoo.registry, "_replaced", [])  # this test's record only
    softmax = family("softmax")
    builtin = softmax.backends["naive"]
    q = torch.randn(1, 2, 3, 4)
    register = register_backend(
        "softmax", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES | MODS)
    )
    with pytest.raises(ValueError, match=r"^softmax backend 'naive' is already registered: "
                       r"<function naive .*>; pass replace=True to replace it \(recorded: "
                       r"attn_zoo.registry.replaced_names\)$"):  # fmt: skip
        register(doubled)
    assert softmax.backends["naive"] is builtin
    assert attn_zoo.registry.replaced_names() == []

    register_backend("softmax", "naive", tier="naive", priority=0, replace=True,
                     capabilities=Capabilities(FEATURES | MODS))(doubled)  # fmt: skip
    assert softmax.backends["naive"].fn is doubled
    torch.testing.assert_close(softmax_attention(q, q, q, backend="naive"), 2 * naive(q, q, q))
    assert attn_zoo.registry.replaced_names() == [("softmax backend", "naive")]

    register_backend("softmax", "doubled", tier="fused", priority=-100, replace=True,
                     capabilities=Capabilities(FEATURES))(doubled)  # fmt: skip
    assert attn_zoo.registry.replaced_names() == [("softmax backend", "naive")]  # a new name
