"""Block masks derived from mask mods (attn_zoo/kernels/softmax/blocks.py): on drawn mods
(windows, documents, prefixes, mods reading b or h, their and / or / not combinations,
shifted queries) and shapes around small tiles (M != N included), the derived classes are
the dense mask's tiles, and chunked with them (every causal alignment) gives float64 naive's
outputs and gradients; chunked touches only the tiles the block mask keeps and applies the
mod only on partial ones; the cache classifies a rebuilt mod once and never gives a stale
block mask to a mod computing another mask."""

from collections import OrderedDict

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.kernels.softmax import (
    and_masks,
    block_mask,
    blocks,
    not_mask,
    or_masks,
    softmax_attention,
)
from attn_zoo.kernels.softmax.blocks import EMPTY, FULL, PARTIAL, mod_key
from attn_zoo.kernels.softmax.chunked import Tiles, chunked
from attn_zoo.kernels.softmax.masks import align_causal
from attn_zoo.kernels.softmax.mods import (
    apply_mask_mod,
    causal,
    document,
    mask_from_mod,
    prefix_lm,
    shift_queries,
    sliding_window,
)
from attn_zoo.kernels.softmax.sdpa import sdpa


def per_batch_documents(size: int):
    """Documents of `size` + b tokens in batch entry b: a mod reading b."""

    def per_batch_document_mask(b, h, q_idx, kv_idx):
        return q_idx // (size + b) == kv_idx // (size + b)

    return per_batch_document_mask


def per_head_window(base: int):
    """Head h sees keys within `base` + h of the query, both ways: a mod reading h."""

    def per_head_window_mask(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < base + h

    return per_head_window_mask


SINGLE_MODS = st.one_of(
    st.builds(sliding_window, st.integers(1, 12), st.booleans()),
    st.builds(document, st.lists(st.integers(1, 9), min_size=1, max_size=4)),
    st.builds(prefix_lm, st.integers(1, 12)),
    st.builds(causal),
    st.builds(per_batch_documents, st.integers(2, 6)),
    st.builds(per_head_window, st.integers(1, 4)),
)
MASK_MODS = st.recursive(
    SINGLE_MODS,
    lambda inner: st.one_of(
        st.builds(not_mask, inner),
        st.lists(inner, min_size=2, max_size=3).map(lambda mods: and_masks(*mods)),
        st.lists(inner, min_size=2, max_size=3).map(lambda mods: or_masks(*mods)),
    ),
    max_leaves=4,
)


@st.composite
def tiled_shapes(draw):
    """(block, B, H, N, M): small tiles, lengths around them (an edge or any up to 3 tiles)."""
    block = draw(st.sampled_from([2, 4, 8]))
    edges = [1, block - 1, block, block + 1, 2 * block + 1, 3 * block]
    length = st.one_of(st.sampled_from([e for e in edges if e >= 1]), st.integers(1, 3 * block))
    return block, draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(length), draw(length)


@st.composite
def drawn_mods(draw):
    """A drawn mask mod, its queries sometimes shifted (a cached decoding step's offset)."""
    mod = draw(MASK_MODS)
    offset = draw(st.integers(0, 5))
    return shift_queries(mod, offset, score=False) if offset else mod


def dense_classes(mod, b, h, n, m, block) -> torch.Tensor:
    """The tile classes read off the materialised mask, tile by tile."""
    dense = mask_from_mod(mod, b, h, n, m, "cpu")
    classes = torch.empty(-(-n // block), -(-m // block), dtype=torch.int8)
    for i, i0 in enumerate(range(0, n, block)):
        for j, j0 in enumerate(range(0, m, block)):
            tile = dense[..., i0 : i0 + block, j0 : j0 + block]
            classes[i, j] = FULL if tile.all() else PARTIAL if tile.any() else EMPTY
    return classes


@given(drawn_mods(), tiled_shapes())
def test_the_block_mask_is_the_dense_masks_tiles(mod, shape):
    block, b, h, n, m = shape
    want = dense_classes(mod, b, h, n, m, block)
    assert torch.equal(block_mask(mod, b, h, n, m, block, "cpu"), want)
    assert torch.equal(block_mask(mod, b, h, n, m, block, "cpu"), want)  # from the cache


KERNELS = ("chunked", "sdpa")  # the backends tiling by the block mask


def tiled(kernel: str, q, k, v, is_causal, mod, block: int):
    """`kernel` called directly, to set its tile (`block`), with what the family's dispatch
    would give it: sdpa takes bottom-right causality as an explicit mask."""
    if kernel == "chunked":
        return chunked(q, k, v, is_causal=is_causal, mask_mod=mod, block=block)
    mask, is_causal = align_causal(None, is_causal, q.shape[2], k.shape[2], q.device)
    return sdpa(q, k, v, mask, is_causal, mask_mod=mod, block=block)


@pytest.mark.parametrize("kernel", KERNELS)
@given(drawn_mods(), tiled_shapes(), st.sampled_from([False, True, "bottom_right"]), st.data())
def test_the_tiled_kernels_with_the_block_mask_are_float64_naive(
    kernel, mod, shape, is_causal, data
):
    """chunked's tiles and sdpa's spans of key tiles (one SDPA call per query tile) on drawn
    mods and shapes around their tiles: outputs and gradients of float64 naive."""
    block, b, h, n, m = shape
    kv_heads = data.draw(st.sampled_from([k for k in (1, h) if h % k == 0]))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    shapes = ((b, h, n, 4), (b, kv_heads, m, 4), (b, kv_heads, m, 3), (b, h, n, 3))
    q, k, v, cotangent = (torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes)
    results = []
    for run in (
        lambda q, k, v: tiled(kernel, q, k, v, is_causal, mod, block),
        lambda q, k, v: softmax_attention(
            q, k, v, is_causal=is_causal, mask_mod=mod, backend="naive"
        ),
    ):
        inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = run(*inputs)
        results.append((out, *torch.autograd.grad(out, inputs, cotangent)))
    for name, got, want in zip(("output", "dq", "dk", "dv"), *results, strict=True):
        torch.testing.assert_close(got, want, msg=name)


def test_chunked_touches_the_kept_tiles_only_and_masks_the_partial_ones(monkeypatch):
    """Packed causal documents: forward computes the scores of the non-empty tiles only, and
    evaluates the mod on the partial ones only (the full ones need no mask)."""
    mod, block, n = and_masks(document([5, 14, 3, 10]), causal()), 4, 32
    classes = dense_classes(mod, 1, 2, n, n, block)
    assert (classes == FULL).any() and (classes == EMPTY).any()  # the case tells them apart
    scored, masked = [], []
    scores = Tiles.scores
    monkeypatch.setattr(Tiles, "scores", lambda self, *a: scored.append(1) or scores(self, *a))
    monkeypatch.setattr(
        "attn_zoo.kernels.softmax.chunked.apply_mask_mod",
        lambda *a: masked.append(1) or apply_mask_mod(*a),
    )
    q, k, v = torch.randn(3, 1, 2, n, 8).unbind()
    chunked(q, k, v, mask_mod=mod, block=block)
    assert len(scored) == int((classes != EMPTY).sum())
    assert len(masked) == int((classes == PARTIAL).sum())


def test_a_rebuilt_mod_is_classified_once_and_another_mask_again(monkeypatch):
    monkeypatch.setattr(blocks, "_CACHE", OrderedDict())  # empty, whatever ran before
    calls = []
    classify = blocks.classify
    monkeypatch.setattr(blocks, "classify", lambda *a: calls.append(1) or classify(*a))
    for window in (5, 5, 6, 5):  # the same mod rebuilt, and another window
        block_mask(sliding_window(window), 1, 1, 40, 40, 4, "cpu")
    block_mask(shift_queries(sliding_window(5), 3, score=False), 1, 1, 40, 40, 4, "cpu")
    block_mask(shift_queries(sliding_window(5), 3, score=False), 1, 1, 40, 40, 4, "cpu")
    assert len(calls) == 3  # window 5, window 6, window 5 shifted by 3
    # a captured tensor changed in place: the same mod object now computes another mask
    ids = torch.tensor([0] * 20 + [1] * 20)

    def by_ids(b, h, q_idx, kv_idx):
        return ids[q_idx] == ids[kv_idx]

    for _ in range(2):
        want = dense_classes(by_ids, 1, 1, 40, 40, 4)
        assert torch.equal(block_mask(by_ids, 1, 1, 40, 40, 4, "cpu"), want)
        ids[5:] = 2


def test_a_mod_that_cannot_be_keyed_is_classified_every_call():
    class Window:
        def __init__(self, width):
            self.width = width

        def __call__(self, b, h, q_idx, kv_idx):
            return (q_idx - kv_idx).abs() < self.width

    window = Window(3)
    assert mod_key(window, []) is None
    first = block_mask(window, 1, 1, 24, 24, 4, "cpu")
    window.width = 9
    second = block_mask(window, 1, 1, 24, 24, 4, "cpu")
    assert torch.equal(first, dense_classes(Window(3), 1, 1, 24, 24, 4))
    assert torch.equal(second, dense_classes(window, 1, 1, 24, 24, 4))


def test_an_impure_mod_leaves_every_tile_partial():
    window = sliding_window(3)

    def drifting(b, h, q_idx, kv_idx):
        return window(b, h, q_idx, kv_idx)

    drifting.pure = False
    assert (block_mask(drifting, 1, 1, 10, 10, 4, "cpu") == PARTIAL).all()


def test_and_or_not_combine_masks_as_logic_says():
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    window, prefix, docs = sliding_window(3), prefix_lm(4), document([5, 7])
    dense = {mod: mask_from_mod(mod, 1, 1, 12, 12, "cpu")[0, 0] for mod in (window, prefix, docs)}
    cases = {
        "and": (and_masks(window, docs), dense[window] & dense[docs]),
        "or": (or_masks(window, prefix, docs), dense[window] | dense[prefix] | dense[docs]),
        "not": (not_mask(prefix), ~dense[prefix]),
        "one": (and_masks(window), (j <= i) & (i - j < 3)),
    }
    for name, (mod, want) in cases.items():
        assert torch.equal(mask_from_mod(mod, 1, 1, 12, 12, "cpu")[0, 0], want), name
    combined = or_masks(window, not_mask(prefix))
    assert combined.__name__ == "or_masks(sliding_window_mask, not_mask(prefix_lm_mask))"
    impure = sliding_window(2)
    impure.pure = False
    assert combined.pure and not and_masks(window, impure).pure


def test_combinations_refuse_what_is_not_a_mask_mod():
    with pytest.raises(ValueError, match=r"and_masks\(\) needs one or more mask mods"):
        and_masks()
    with pytest.raises(ValueError, match="or_masks: argument 1 is int 3: must be a mask mod"):
        or_masks(causal(), 3)
    with pytest.raises(ValueError, match="not_mask: argument 0 is str 'causal'"):
        not_mask("causal")

    def float_mask(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx).float()

    with pytest.raises(ValueError, match="mask_mod float_mask returned a torch.float32 tensor"):
        mask_from_mod(and_masks(causal(), float_mask), 1, 1, 4, 4, "cpu")
    with pytest.raises(ValueError, match="block=0: must be a positive int"):
        block_mask(causal(), 1, 1, 4, 4, 0, "cpu")


@pytest.mark.parametrize("combine", [and_masks, or_masks])
def test_a_prefix_lm_combined_still_opens_the_prefix_in_a_causal_layer(combine):
    """and_masks / or_masks of prefix_lm(3) and document([4, 4]) in a causal layer: the first
    document's prefix sees itself both ways (query 0 reads key 1; causality applied on top
    would hide it), and with and_masks no query reads the other document."""
    mod = combine(prefix_lm(3), document([4, 4]))
    layer = az.build("standard", d_model=8, n_heads=2, mask_mod=mod, backend="naive")
    x = torch.randn(1, 8, 8, requires_grad=True)
    layer(x, is_causal=True)[0, 0].sum().backward()
    assert x.grad[0, 1].abs().sum() > 0
    if combine is and_masks:
        assert (x.grad[0, 4:] == 0).all()


@pytest.mark.parametrize(
    "change",
    [
        lambda t: setattr(t, "data", torch.tensor([2])),  # no version bump
        lambda t: t.numpy().__setitem__(0, 2),  # through a NumPy array sharing its memory
        lambda t: t.fill_(2),
    ],
)
def test_a_captured_tensor_changed_any_way_is_never_served_a_stale_block_mask(change):
    """The hostile pass: after `t.data = ...` (which bumps no version) chunked reused the
    block mask of the old value (every tile full): 2.27 off naive in float64."""
    t = torch.tensor([16])

    def mask(b, h, q_idx, kv_idx):
        return kv_idx < t[0]

    q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.float64) for _ in range(3))
    chunked(q, k, v, mask_mod=mask, block=4)  # classified: every tile full
    change(t)
    want = softmax_attention(q, k, v, mask_mod=mask, backend="naive")
    torch.testing.assert_close(chunked(q, k, v, mask_mod=mask, block=4), want)


def test_a_mod_reading_an_inference_tensor_runs_on_chunked():
    with torch.inference_mode():
        limit = torch.tensor([5])

    def mask(b, h, q_idx, kv_idx):
        return kv_idx < limit[0]

    q, k, v = (torch.randn(1, 2, 9, 8, dtype=torch.float64) for _ in range(3))
    want = softmax_attention(q, k, v, mask_mod=mask, backend="naive")
    torch.testing.assert_close(chunked(q, k, v, mask_mod=mask, block=4), want)
