"""Standard attention: backends agree over its options (grouped kv heads, key width, biases, a
branch of dual attention), the reference package is matched. What every mechanism promises
(causality, masks, permutation, dropout, training, ...): tests/test_mechanism_contract.py."""

import torch
from dual_attention.attention import Attention
from hypothesis import given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.testing import assert_mechanism_backends_agree

BACKENDS = ["naive", "chunked", "sdpa", "fused", "auto"]


@st.composite
def standard_configs(draw):
    kv_heads = draw(st.integers(1, 2))
    n_heads = kv_heads * draw(st.integers(1, 3))
    total = n_heads + draw(st.sampled_from([0, 0, 2]))
    return dict(
        d_model=total * draw(st.integers(1, 6)),
        n_heads=n_heads,
        n_kv_heads=kv_heads,
        total_n_heads=total,
        key_dim=draw(st.one_of(st.none(), st.integers(1, 7))),
        add_bias_kv=draw(st.booleans()),
        add_bias_out=draw(st.booleans()),
    )


@given(
    standard_configs(),
    st.integers(1, 20),
    st.booleans(),
    st.sampled_from(["none", "padding", "empty"]),
    st.integers(0, 99),
)
def test_backends_agree(config, length, is_causal, mask_kind, seed):
    mask = None
    if mask_kind == "padding":
        mask = (
            torch.arange(length)[None, None, None, :]
            < torch.tensor([length, max(1, length // 2)])[:, None, None, None]
        )
    elif mask_kind == "empty":
        mask = torch.rand(2, 1, length, length, generator=torch.Generator().manual_seed(seed)) < 0.5
    report = assert_mechanism_backends_agree(
        "standard",
        config,
        batch=2,
        length=length,
        attn_mask=mask,
        is_causal=is_causal,
        backends=BACKENDS,
        seed=seed,
    )
    assert set(report.values()) == {"ok"}


def test_matches_the_reference_package():
    """Same weights as dual_attention.attention.Attention, float64, to 1e-12."""
    torch.manual_seed(0)
    ref = Attention(
        d_model=24,
        n_heads=4,
        dropout=0.0,
        key_dim=5,
        n_kv_heads=2,
        add_bias_kv=True,
        total_n_heads=6,
    ).double()
    ours = az.build(
        "standard",
        d_model=24,
        n_heads=4,
        key_dim=5,
        n_kv_heads=2,
        add_bias_kv=True,
        total_n_heads=6,
    ).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 11, 24, dtype=torch.float64)
    mask = torch.rand(11, 11) < 0.8
    mask[:, 0] = True  # the reference gives NaN on a row with no key; we give zeros
    for backend in ("naive", "chunked", "sdpa"):
        ours.backend = backend
        torch.testing.assert_close(
            ours(x, is_causal=True), ref(x, x, x, is_causal=True)[0], atol=1e-12, rtol=0
        )
        torch.testing.assert_close(
            ours(x, attn_mask=mask), ref(x, x, x, attn_mask=mask)[0], atol=1e-12, rtol=0
        )
