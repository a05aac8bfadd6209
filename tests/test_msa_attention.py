"""MSA row (untied and tied) and column attention: every softmax backend against the float64
naive reference (outputs and gradients), the paper's definition, padding, clear errors."""

import pytest
import torch
from einops import einsum, rearrange
from hypothesis import example, given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.testing import assert_mechanism_backends_agree, lengths

VARIANTS = [("msa_row", {}), ("msa_row", {"tied": True}), ("msa_column", {})]
BACKENDS = ["naive", "chunked", "sdpa"]


def padding_mask(kind: str, b: int, r: int, c: int, gen: torch.Generator):
    """None; rows and columns padded at the end (an MSA batch); or a ragged random mask."""
    if kind == "none":
        return None
    if kind == "ragged":
        return torch.rand(b, r, c, generator=gen) < 0.7
    rows = torch.arange(r).view(1, r, 1) < torch.randint(0, r + 1, (b, 1, 1), generator=gen)
    cols = torch.arange(c).view(1, 1, c) < torch.randint(0, c + 1, (b, 1, 1), generator=gen)
    return rows & cols


@given(
    st.sampled_from(VARIANTS),
    st.integers(1, 2),
    lengths(9),
    lengths(17),
    st.sampled_from(["none", "padded", "ragged"]),
    st.integers(0, 999),
)
def test_backends_agree(variant, n_heads, rows, cols, mask_kind, seed):
    name, kwargs = variant
    gen = torch.Generator().manual_seed(seed + 1)
    mask = padding_mask(mask_kind, 2, rows, cols, gen)
    report = assert_mechanism_backends_agree(
        name,
        dict(d_model=4 * n_heads, n_heads=n_heads, **kwargs),
        shape=(2, rows, cols, 4 * n_heads),
        attn_mask=mask,
        seed=seed,
    )
    assert {report[b] for b in (*BACKENDS, "fused")} == {"ok"}


def tied_definition(m, x, mask=None):
    """Rao et al. (2021), tied row attention, term by term: per-row logits summed over rows
    and scaled by 1/sqrt(rows); with padding, only pairs of real tokens enter the sum, keys
    real in no row are masked, rows count if they hold a real token, pads output zeros."""
    q, k, v = m.heads(x)  # (B, H, R, C, d)
    real = torch.ones(x.shape[:3], dtype=torch.bool) if mask is None else mask
    pairs = einsum(real.double(), real.double(), "b r i, b r j -> b r i j")[:, None]
    per_row = einsum(q, k, "b h r i d, b h r j d -> b h r i j") * pairs  # (B, H, R, C, C)
    n_rows = real.any(dim=2).sum(dim=1).clamp(min=1).double().view(-1, 1, 1, 1)
    logits = per_row.sum(dim=2) / (m.head_dim**0.5 * n_rows**0.5)  # (B, H, C, C)
    keys = real.any(dim=1)[:, None, None, :]  # (B, 1, 1, C)
    attn = logits.masked_fill(~keys, float("-inf")).softmax(dim=-1).nan_to_num()
    out = einsum(attn, v * real[:, None, ..., None], "b h i j, b h r j d -> b r i h d")
    return m.wo(rearrange(out, "b r i h d -> b r i (h d)")) * real[..., None]


@given(lengths(6), lengths(9), st.sampled_from(["none", "padded", "ragged"]), st.integers(0, 99))
@example(rows=0, cols=3, mask_kind="padded", seed=0)  # no row to tie: the empty output
def test_tied_is_the_papers_definition(rows, cols, mask_kind, seed):
    torch.manual_seed(seed)
    m = az.build("msa_row", d_model=8, n_heads=2, tied=True).double()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, rows, cols, 8, dtype=torch.float64, generator=gen)
    mask = padding_mask(mask_kind, 2, rows, cols, gen)
    want = tied_definition(m, x, mask)
    for backend in BACKENDS:
        m.backend = backend
        torch.testing.assert_close(m(x, attn_mask=mask), want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "kwargs"), VARIANTS)
def test_padding_changes_nothing_at_real_tokens_and_pads_output_zeros(name, kwargs, backend):
    torch.manual_seed(0)
    m = az.build(name, backend=backend, d_model=8, n_heads=2, **kwargs).double()
    msa = torch.randn(1, 3, 4, 8, dtype=torch.float64)
    padded = torch.randn(1, 5, 7, 8, dtype=torch.float64)
    padded[:, :3, :4] = msa
    mask = torch.zeros(1, 5, 7, dtype=torch.bool)
    mask[:, :3, :4] = True
    out = m(padded, attn_mask=mask)
    torch.testing.assert_close(out[:, :3, :4], m(msa), atol=1e-10, rtol=0)
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_tied_with_one_row_is_untied(backend):
    torch.manual_seed(0)
    tied = az.build("msa_row", backend=backend, d_model=8, n_heads=2, tied=True)
    untied = az.build("msa_row", backend=backend, d_model=8, n_heads=2)
    untied.load_state_dict(tied.state_dict())
    x = torch.randn(2, 1, 9, 8)
    torch.testing.assert_close(tied(x), untied(x))
    x = torch.randn(2, 3, 9, 8)
    assert not torch.allclose(tied(x), untied(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_column_attention_is_row_attention_on_the_transposed_alignment(backend):
    torch.manual_seed(0)
    column = az.build("msa_column", backend=backend, d_model=8, n_heads=2)
    row = az.build("msa_row", backend=backend, d_model=8, n_heads=2)
    row.load_state_dict(column.state_dict())
    x = torch.randn(2, 4, 6, 8)
    mask = torch.rand(2, 4, 6) < 0.7
    want = row(x.transpose(1, 2), attn_mask=mask.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(column(x, attn_mask=mask), want)


def test_tied_chunked_never_builds_per_row_or_full_attention_maps():
    """Tied attention on the chunked backend saves nothing of (heads x C x C) elements for
    backward (the naive backend does: the check can fail), let alone (R x C x C)."""
    rows, cols, heads = 8, 128, 2
    x = torch.randn(1, rows, cols, 8)
    mask = torch.rand(1, rows, cols) < 0.9
    largest = {}
    for backend in ("chunked", "naive"):
        m = az.build("msa_row", backend=backend, d_model=8, n_heads=heads, tied=True)
        sizes = []
        hooks = (lambda t, sizes=sizes: sizes.append(t.numel()) or t), (lambda t: t)
        with torch.autograd.graph.saved_tensors_hooks(*hooks):
            m(x, attn_mask=mask).sum().backward()
        largest[backend] = max(sizes)
    assert largest["chunked"] < heads * cols * cols <= largest["naive"]


def test_backend_names_and_state_dict():
    """The softmax backends; bias=False leaves the four projections' weights (the same for
    every backend: tests/test_mechanism_contract.py)."""
    assert az.list_backends("msa_row") == az.list_backends("standard")
    m = az.build("msa_row", d_model=8, n_heads=2, tied=True, bias=False)
    assert sorted(m.state_dict()) == ["wk.weight", "wo.weight", "wq.weight", "wv.weight"]


@pytest.mark.parametrize("name", ["msa_row", "msa_column"])
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m(torch.randn(1, 3, 8)), r"expected \(B, rows, cols, d_model=8\)"),
        (
            lambda m: m(torch.randn(1, 2, 3, 8), attn_mask=torch.ones(1, 2, 3)),
            "boolean padding mask",
        ),
        (
            lambda m: m(torch.randn(1, 2, 3, 8), attn_mask=torch.ones(1, 1, 3, 3).bool()),
            r"\(B, rows, cols\) = \(1, 2, 3\)",
        ),
    ],
)
def test_errors_name_the_option_and_what_is_valid(name, call, match):
    with pytest.raises(ValueError, match=match):
        call(az.build(name, d_model=8, n_heads=2))


def test_bad_build_arguments():
    with pytest.raises(ValueError, match="d_model=10 must be divisible"):
        az.build("msa_row", d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="'tied'"):
        az.build("msa_column", d_model=8, n_heads=2, tied=True)
