"""Hypothesis strategies for attention problems.

Lengths include 0 (no queries, or no keys: as often as each other edge length), 1 and
non-powers of two, and, given a kernel's block sizes, the lengths around
each block b (`block_edges`: b - 1, b, b + 1, 2b + 1); masks are boolean or additive float and
include rows that see no key; causal alignment top-left or bottom-right; kv heads divide the
query heads (grouped-query attention); value width may differ from key width; batches of 1 to 3
(a kernel can be wrong past the second sequence only) with batch x heads at most 6 (a problem
costs B H N M: a batch of 3 comes with 1 or 2 heads, 4 or 6 heads with a batch of 1, and the
mean cost stays that of the former batches of 1 or 2); q, k, v and the mask contiguous or not
(a problem's ``layout``: transposed views as models make them, or strided along the width, a
mask's broadcast dimensions then expanded with stride 0); torch runs with 1 or 2 threads (a
problem's ``threads``); some inputs may require no grad (a problem's ``frozen``: any subset
of q, k, v, shrinking to none, so a backward right only when every input needs a gradient is
caught). Score and mask mods are drawn where asked for: the kit's
(``score_mods=ALL_SCORE_MODS``, ``mask_mods=ALL_MASK_MODS``) and a user's functions.
`mechanism_problems` draws calls of a whole mechanism the same way: lengths with 0, 1, odd
ones and block edges, masks of every `MECHANISM_MASKS` kind (rows that see no key among them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations

import torch
from hypothesis import strategies as st

from attn_zoo.kernels.relational.activations import REL_ACTIVATIONS
from attn_zoo.mechanisms.base import check_int
from attn_zoo.testing.problems import (
    LAYOUTS,
    MASK_KINDS,
    MASK_MODS,
    MECHANISM_MASKS,
    SCORE_MODS,
    AttentionProblem,
    MechanismProblem,
    RelationalProblem,
    check_names,
    relational_tensors,
)

LENGTHS = (0, 1, 2, 3, 7, 16, 31, 64, 100)  # the edge lengths, 0 (an empty sequence) first
SCALES = st.one_of(st.none(), st.floats(0.05, 2.0))
THREADS = (1, 2)
ALL_SCORE_MODS = (None, *SCORE_MODS)  # no mod, or one of the kit's
ALL_MASK_MODS = (None, *MASK_MODS)
Mods = Sequence[str | Callable | None]


def frozen_inputs(names: Sequence[str]) -> st.SearchStrategy[tuple[str, ...]]:
    """Which of `names` (a problem's tensor inputs) require no grad: every subset alike (in
    the order of `names`), shrinking to () (every input requires grad)."""
    return st.sampled_from([c for r in range(len(names) + 1) for c in combinations(names, r)])


def block_edges(block: int) -> tuple[int, ...]:
    """Lengths where a kernel tiling by `block` changes: one short of a block, exactly one,
    one over, and several blocks with a partial one (2 block + 1, odd)."""
    return tuple(n for n in (block - 1, block, block + 1, 2 * block + 1) if n >= 1)


def batches(max_batch: int, heads: int, max_batch_heads: int) -> st.SearchStrategy[int]:
    """Batch sizes from 1 to `max_batch`, at most `max_batch_heads` // `heads` (at least 1)."""
    return st.integers(1, max(1, min(max_batch, max_batch_heads // heads)))


def lengths(
    max_len: int = 100, block_sizes: Sequence[int] = (), min_len: int = 0
) -> st.SearchStrategy[int]:
    """Sequence lengths: edge values first (those of LENGTHS from `min_len` to `max_len`, 0
    among them by default, and the `block_edges` of every block size, even above `max_len`),
    then any integer from max(1, `min_len`) to `max_len`. ``min_len=1`` draws no empty
    sequence (for a kernel declaring it serves none: the relational ``cpp`` backend)."""
    check_int("min_len", min_len, low=0)
    check_int("max_len", max_len, low=max(1, min_len))
    edges = [n for n in LENGTHS if min_len <= n <= max_len]
    edges += sorted({n for b in block_sizes for n in block_edges(b)} - set(edges))
    return st.one_of(st.sampled_from(edges), st.integers(max(1, min_len), max_len))


@st.composite
def attention_problems(
    draw,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    max_len: int = 100,
    max_batch: int = 3,
    max_batch_heads: int = 6,
    max_kv_heads: int = 2,
    max_groups: int = 3,
    max_width: int = 16,
    masks: tuple[str, ...] = MASK_KINDS,
    causal: tuple[bool | str, ...] = (False, True, "bottom_right"),
    same_lengths: bool = False,
    same_widths: bool = False,
    scales: st.SearchStrategy[float | None] = SCALES,
    block_sizes: Sequence[int] = (),
    threads: tuple[int | None, ...] = THREADS,
    score_mods: Mods = (None,),
    mask_mods: Mods = (None,),
    layouts: tuple[str, ...] = LAYOUTS,
    freeze: Sequence[str] = ("q", "k", "v"),
    min_len: int = 0,
) -> AttentionProblem:
    """Draw an `AttentionProblem`; narrow it with the arguments (e.g. ``masks=("none",)``;
    ``scales=st.none()`` keeps the default scale 1/sqrt(key_dim)); `max_batch_heads`: the
    largest batch x heads drawn (`batches`); `block_sizes`: the tile
    sizes of the kernels under test (their `block_edges` are drawn as lengths); `threads`:
    torch thread counts to run with; `layouts`: how q, k, v may lie in memory
    (`problems.LAYOUTS`, e.g. ``("contiguous",)``); `freeze`: the inputs that may be drawn
    ``frozen`` (no requires_grad; () for none: every gradient always compared); `score_mods`,
    `mask_mods`: the mods to draw from (kit names, a user's functions, None for none; default
    none), e.g. ``score_mods=(*ALL_SCORE_MODS, my_score_mod)``; `min_len`: the shortest
    q_len and k_len drawn (0 by default: no queries, no keys; `lengths`)."""
    check_names("masks", masks, MASK_KINDS)
    check_names("layouts", layouts, LAYOUTS)
    check_names("freeze", freeze, ("q", "k", "v"))
    kv_heads = draw(st.integers(1, max_kv_heads))
    heads = kv_heads * draw(st.integers(1, max_groups))
    q_len = draw(lengths(max_len, block_sizes, min_len))
    key_dim = draw(st.integers(1, max_width))
    return AttentionProblem(
        batch=draw(batches(max_batch, heads, max_batch_heads)),
        heads=heads,
        kv_heads=kv_heads,
        q_len=q_len,
        k_len=q_len if same_lengths else draw(lengths(max_len, block_sizes, min_len)),
        key_dim=key_dim,
        value_dim=key_dim if same_widths else draw(st.integers(1, max_width)),
        mask=draw(st.sampled_from(masks)),
        is_causal=draw(st.sampled_from(causal)),
        scale=draw(scales),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**31 - 1)),
        threads=draw(st.sampled_from(threads)),
        score_mod=draw(st.sampled_from(score_mods)),
        mask_mod=draw(st.sampled_from(mask_mods)),
        layout=draw(st.sampled_from(layouts)),
        frozen=draw(frozen_inputs(freeze)),
    )


@st.composite
def relational_problems(
    draw,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    max_len: int = 64,
    max_batch: int = 3,
    max_batch_heads: int = 6,
    max_width: int = 8,
    rel_activations: tuple[str, ...] = tuple(REL_ACTIVATIONS),
    masks: tuple[str, ...] = MASK_KINDS,
    causal: tuple[bool | str, ...] = (False, True, "bottom_right"),
    relative: tuple[bool, ...] = (False, True),
    scales: st.SearchStrategy[float | None] = SCALES,
    block_sizes: Sequence[int] = (),
    threads: tuple[int | None, ...] = THREADS,
    layouts: tuple[str, ...] = LAYOUTS,
    freeze: bool = True,
    min_len: int = 0,
) -> RelationalProblem:
    """Draw a `RelationalProblem`; narrow it with the arguments (`scales` draws both the
    attention and the relation scale; None is the default 1/sqrt(width); `max_batch`,
    `max_batch_heads`, `block_sizes`, `threads` and `layouts` as in `attention_problems`;
    `freeze`: whether some of the tensor inputs may be drawn ``frozen``; `min_len` as in
    `attention_problems`)."""
    check_names("rel_activations", rel_activations, REL_ACTIVATIONS)
    check_names("masks", masks, MASK_KINDS)
    check_names("layouts", layouts, LAYOUTS)
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 2))
    q_len = draw(lengths(max_len, block_sizes, min_len))
    max_rel_pos = draw(st.integers(0, 5)) if draw(st.sampled_from(relative)) else None
    return RelationalProblem(
        batch=draw(batches(max_batch, heads, max_batch_heads)),
        heads=heads,
        kv_heads=kv_heads,
        n_relations=draw(st.integers(1, 3)),
        q_len=q_len,
        k_len=draw(st.one_of(st.just(q_len), lengths(max_len, block_sizes, min_len))),
        key_dim=draw(st.integers(1, max_width)),
        rel_dim=draw(st.integers(1, max_width)),
        head_dim=draw(st.integers(1, max_width)),
        max_rel_pos=max_rel_pos,
        rel_activation=draw(st.sampled_from(rel_activations)),
        mask=draw(st.sampled_from(masks)),
        is_causal=draw(st.sampled_from(causal)),
        scale=draw(scales),
        rel_scale=draw(scales),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**31 - 1)),
        threads=draw(st.sampled_from(threads)),
        layout=draw(st.sampled_from(layouts)),
        frozen=draw(frozen_inputs(relational_tensors(max_rel_pos))) if freeze else (),
    )


@st.composite
def mechanism_problems(
    draw,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    max_len: int = 40,
    max_batch: int = 3,
    masks: tuple[str, ...] = ("none", *MECHANISM_MASKS),
    causal: tuple[bool, ...] = (False, True),
    block_sizes: Sequence[int] = (),
) -> MechanismProblem:
    """Draw a `MechanismProblem` (one call of a mechanism on x (batch, length, d_model)) for
    `assert_mechanism_backends_agree`; narrow it with the arguments (`masks`: "none" and kinds
    of `MECHANISM_MASKS`; `causal`, e.g. ``(True,)`` for a causal-only mechanism;
    `block_sizes` as in `attention_problems`)::

        @given(mechanism_problems())
        def test_mine(problem):
            assert_mechanism_backends_agree("mine", kwargs, **problem.arguments())
    """
    check_names("masks", masks, ("none", *MECHANISM_MASKS))
    return MechanismProblem(
        batch=draw(st.integers(1, max_batch)),
        length=draw(lengths(max_len, block_sizes)),
        mask=draw(st.sampled_from(masks)),
        is_causal=draw(st.sampled_from(causal)),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
