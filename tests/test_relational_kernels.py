"""Every relational backend against the float64 naive reference, outputs and gradients."""

import functools
from dataclasses import dataclass

import pytest
import torch
from allocations import largest_allocation
from hypothesis import given
from hypothesis import strategies as st

from attn_zoo.kernels import UnsupportedCallError
from attn_zoo.kernels.dispatch import Call, family
from attn_zoo.kernels.relational import relational_attention
from attn_zoo.kernels.relational.chunked import BLOCK, chunked
from attn_zoo.kernels.relational.cpp import BLOCKS, cpp_missing
from attn_zoo.kernels.softmax.masks import saturated
from attn_zoo.testing import RelationalProblem, assert_backends_agree, relational_problems


@dataclass(frozen=True)
class PairProblem:
    """A `RelationalProblem` whose symbol values are pairwise: v_pair (Hkv, N, M, hd), or
    (B, Hkv, N, M, hd) if `batched`, instead of v."""

    base: RelationalProblem
    batched: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    @property
    def seed(self) -> int:
        return self.base.seed

    def inputs(self, dtype: torch.dtype | None = None, device: str = "cpu") -> dict:
        x = self.base.inputs(dtype, device)
        v = x.pop("v")
        b = self.base
        shape = (b.kv_heads, b.q_len, b.k_len, b.head_dim)
        shape = (b.batch, *shape) if self.batched else shape
        gen = torch.Generator().manual_seed(b.seed + 1)
        pairs = torch.randn(shape, generator=gen, dtype=torch.float64)
        x["v_pair"] = pairs.to(v.dtype).to(device).requires_grad_(True)
        return x


@st.composite
def pair_problems(draw, dtypes=(torch.float64,), max_len=24):
    base = draw(relational_problems(dtypes=dtypes, max_len=max_len, relative=(False,)))
    return PairProblem(base, draw(st.booleans()))


@given(relational_problems(block_sizes=(BLOCK,)))
def test_chunked_agrees_float32(problem):
    assert_backends_agree(problem, "relational", backends=["chunked"])


# (N, M) around chunked's BLOCK (256) and cpp's tiles (BLOCKS: 128 and 256): one short, exact,
# one over, several blocks
CPP_TILES = sorted({size for tiles in BLOCKS.values() for size in tiles})
BOUNDARIES = [(1, 129), (127, 128), (129, 257), (255, 256), (256, 256), (257, 513), (513, 129)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "m"), BOUNDARIES)
def test_every_backend_agrees_around_its_block_boundaries(n, m, threads):
    """Every backend serving the call (cpp where it builds: no mask, identity relations, even
    cases), outputs and grads, with 1 and 2 torch threads."""
    assert CPP_TILES == [128, 256] and BLOCK == 256  # the boundaries above
    case = BOUNDARIES.index((n, m))
    plain = case % 2 == 0
    problem = RelationalProblem(
        batch=1, heads=2, kv_heads=1, n_relations=2, q_len=n, k_len=m, key_dim=8, rel_dim=4,
        head_dim=8, rel_activation="identity" if plain else "softmax",
        mask="none" if plain else ("additive", "key_padding", "empty_rows")[case % 3],
        is_causal=(False, True, "bottom_right")[case % 3], seed=case, threads=threads,
    )  # fmt: skip
    report = assert_backends_agree(problem, "relational")
    assert report["naive"] == report["chunked"] == "ok"
    if plain and cpp_missing() is None and problem.is_causal != "bottom_right":
        assert report["cpp"] == "ok"


@given(relational_problems(dtypes=(torch.float64,), max_len=40), st.sampled_from([1, 4, 9]))
def test_chunked_multi_tile_float64(problem, block):
    """Small blocks: many tiles, causal tiles skipped (softmax relations still get grads)."""
    assert_backends_agree(
        problem,
        "relational",
        backends=[],
        kernels={"chunked": functools.partial(chunked, block=block)},
        kernel_features=family("relational").backends["chunked"].capabilities.features,
    )


@given(pair_problems(), st.sampled_from([1, 4, 9, 256]))
def test_chunked_pair_symbols_float64(problem, block):
    """Dense pairwise symbols v_pair, batched or not: chunked (many tiles, causal tiles
    skipped) against naive, outputs and the gradients of q, k, qr, kr and v_pair; masks
    (boolean, additive, empty rows), top-left and bottom-right causality, GQA, every
    rel_activation, N != M."""
    assert_backends_agree(
        problem,
        "relational",
        backends=["chunked"],
        kernels={"chunked tiles": functools.partial(chunked, block=block)},
        kernel_features=family("relational").backends["chunked"].capabilities.features,
    )


@given(pair_problems(dtypes=(torch.float32,), max_len=64))
def test_chunked_pair_symbols_float32(problem):
    assert_backends_agree(problem, "relational", backends=["chunked"])


def test_pair_symbols_only_where_declared():
    """naive and chunked read v_pair; cpp, sdpa and triton do not declare pair_symbols (so a
    new feature never reaches a backend declaring FEATURES - {...}); auto and the chunked
    tier pick chunked, the fused tier refuses naming the feature."""
    relational = family("relational")
    serving = {
        n for n, b in relational.backends.items() if "pair_symbols" in b.capabilities.features
    }
    assert serving == {"naive", "chunked"}
    problem = PairProblem(RelationalProblem(kv_heads=1, is_causal=True))
    report = assert_backends_agree(problem, "relational")
    assert report["naive"] == report["chunked"] == "ok"
    assert "does not support pair_symbols" in report["sdpa"]
    x = problem.inputs()
    with pytest.raises(UnsupportedCallError, match="pair_symbols.*can: naive, chunked"):
        relational_attention(**x, backend="fused")
    call = relational.describe(**relational.check(**x))
    assert "pair_symbols" in call.features and relational.select("auto", call).name == "chunked"


def assert_sdpa_agrees(problem: RelationalProblem) -> None:
    """sdpa (value augmentation) agrees with the float64 reference, but where it declines a
    backward through rows masked by float32's min (saturated_mask: SDPA keeps lse = m +
    log l), which chunked then serves."""
    report = assert_backends_agree(problem, "relational")
    x = problem.inputs()
    backward = any(t.requires_grad for t in x.values() if torch.is_tensor(t))
    if backward and saturated(x["attn_mask"]):
        assert "does not support saturated_mask" in report["sdpa"]
        assert report["chunked"] == "ok"
    else:
        assert report["sdpa"] == "ok"


@given(relational_problems(rel_activations=("identity",), relative=(False,)))
def test_value_augmentation_on_sdpa_agrees_float32(problem):
    assert_sdpa_agrees(problem)


@given(
    relational_problems(
        dtypes=(torch.float16, torch.bfloat16),
        max_len=24,
        rel_activations=("identity",),
        relative=(False,),
        scales=st.none(),
    )
)
def test_half_precision(problem):
    """At the default scale 1/sqrt(width). With drawn scales up to 2 on widths of 1-2, torch
    SDPA's own bfloat16 arithmetic exceeds the bfloat16 tolerance (seen: grad q off by 0.07)."""
    assert_sdpa_agrees(problem)


def test_auto_never_picks_a_backend_whose_math_does_not_hold():
    report = assert_backends_agree(RelationalProblem(rel_activation="relu"), "relational")
    assert report["chunked"] == "ok" and "identity rel_activation" in report["sdpa"]
    report = assert_backends_agree(RelationalProblem(max_rel_pos=2), "relational")
    assert report["chunked"] == "ok" and "absolute symbols" in report["sdpa"]
    x = RelationalProblem(rel_activation="tanh").inputs()
    with pytest.raises(
        UnsupportedCallError, match="'fused'.*identity rel_activation.*can: naive, chunked"
    ):
        relational_attention(**x, backend="fused")


@pytest.mark.parametrize("backend", ["naive", "chunked", "sdpa"])
def test_row_with_no_key_gives_zeros_and_finite_grads(backend):
    x = RelationalProblem(q_len=5, k_len=5, mask="empty_rows", seed=3).inputs()
    x["attn_mask"][..., 2, :] = False
    out = relational_attention(**x, backend=backend)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    grads = torch.autograd.grad(out.square().sum(), [x["q"], x["k"], x["qr"], x["kr"], x["v"]])
    assert all(g.isfinite().all() for g in grads)


@pytest.mark.parametrize("backend", ["naive", "chunked", "sdpa"])
def test_dropout_is_unbiased(backend):
    torch.manual_seed(0)
    x = {
        k: v.detach() if torch.is_tensor(v) else v
        for k, v in RelationalProblem(q_len=5, k_len=5).inputs().items()
    }
    exact = relational_attention(**x, backend="naive")
    draws = torch.stack(
        [relational_attention(**x, dropout_p=0.3, backend=backend) for _ in range(3000)]
    )
    assert not torch.allclose(draws[0], exact)
    torch.testing.assert_close(draws.mean(0), exact, atol=0.06, rtol=0)


def test_chunked_dropout_backward_redraws_the_forward_masks():
    x = RelationalProblem(
        q_len=7, k_len=7, rel_activation="softmax", is_causal=True, dtype=torch.float64
    ).inputs()
    names = ["q", "k", "qr", "kr", "v"]

    def fn(*tensors):
        torch.manual_seed(1)
        return chunked(**{**x, **dict(zip(names, tensors, strict=True))}, dropout_p=0.4, block=3)

    assert torch.autograd.gradcheck(fn, tuple(x[n] for n in names))


@pytest.mark.parametrize("mask_shape", ["full", "per_key"])
@pytest.mark.parametrize("is_causal", [False, True, "bottom_right"])
def test_chunked_gives_a_float_mask_its_gradient(mask_shape, is_causal):
    """An additive mask requiring grad gets d out / d mask as naive's autograd gives it:
    float32 chunked in 3-wide tiles and as the family runs it, against float64 naive, every
    gradient atol 5e-5 / rtol 1e-4 (softmax relations: relation grads in skipped tiles)."""
    problem = RelationalProblem(
        batch=2, heads=4, q_len=7, k_len=9, mask="additive", rel_activation="softmax",
        is_causal=is_causal, seed=6,
    )  # fmt: skip
    x = problem.inputs(torch.float64)
    mask = x["attn_mask"] if mask_shape == "full" else x["attn_mask"][:1, :1, :1]
    names = ["q", "k", "qr", "kr", "v", "attn_mask"]
    cotangent = torch.randn(2, 4, 7, 4 + 2, generator=torch.Generator().manual_seed(7))

    def grads(fn, dtype):
        leaves = {n: x[n].detach().to(dtype).requires_grad_(True) for n in names[:-1]}
        leaves["attn_mask"] = mask.to(dtype).requires_grad_(True)
        out = fn(**{**x, **leaves})
        assert out.isfinite().all()
        return torch.autograd.grad(out, list(leaves.values()), cotangent.to(dtype))

    want = grads(functools.partial(relational_attention, backend="naive"), torch.float64)
    relational = family("relational")
    for fn in (functools.partial(chunked, block=3), chunked):
        got = grads(lambda fn=fn, **kw: fn(**relational.check(**kw)), torch.float32)
        for name, g, w in zip(names, got, want, strict=True):
            assert g.shape == w.shape and g.isfinite().all(), name
            torch.testing.assert_close(g.double(), w, atol=5e-5, rtol=1e-4, msg=name)
    assert want[-1].abs().sum() > 0


@pytest.mark.parametrize(("n", "m"), [(64, 4096), (4096, 64)])
def test_chunked_bottom_right_allocates_no_n_by_m_tensor(n, m):
    """Bottom-right causality costs O(N) memory as top-left does: forward and backward
    allocate nothing of N x M / 4 elements (the explicit mask was N x M); naive does."""
    x = RelationalProblem(
        heads=1, kv_heads=1, n_relations=1, q_len=n, k_len=m, key_dim=8, rel_dim=4,
        head_dim=8, is_causal="bottom_right",
    ).inputs()  # fmt: skip

    def run(backend):
        relational_attention(**x, backend=backend).sum().backward()

    assert largest_allocation(lambda: run("naive")) >= n * m
    assert largest_allocation(lambda: run("chunked")) < n * m // 4


@pytest.mark.parametrize(("n", "m"), [(7, 17), (17, 7), (9, 9)])
@pytest.mark.parametrize("symbols", ["absolute", "relative", "pairwise"])
def test_chunked_bottom_right_in_tiles(n, m, symbols):
    """Bottom-right causality per 3-wide tile against float64 naive, outputs and grads, with
    softmax relations (relation grads in the skipped tiles too) and an additive mask."""
    base = RelationalProblem(
        q_len=n, k_len=m, mask="additive", is_causal="bottom_right", rel_activation="softmax",
        max_rel_pos=2 if symbols == "relative" else None, dtype=torch.float64, seed=m,
    )  # fmt: skip
    report = assert_backends_agree(
        PairProblem(base) if symbols == "pairwise" else base,
        "relational",
        backends=["chunked"],
        kernels={"tiles": functools.partial(chunked, block=3)},
        kernel_features=family("relational").backends["chunked"].capabilities.features,
    )
    assert report == {"tiles": "ok", "chunked": "ok"}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(rel_activation="elu"), "rel_activation='elu': valid are"),
        (dict(v_rel=torch.randn(2, 5, 4)), "exactly one of v"),
        (dict(qr=torch.randn(1, 2, 7, 4)), r"qr \(1, 2, 7, 4\)"),
        (dict(dropout_p=-0.1), "dropout_p=-0.1"),
        (dict(v_pair=torch.randn(2, 8, 8, 4)), "exactly one of v"),
        (
            dict(v=None, v_pair=torch.randn(2, 8, 7, 4)),
            r"v_pair \(2, 8, 7, 4\) must be \(Hkv, N, M",
        ),
        (dict(v=None, v_pair=torch.randn(3, 2, 8, 8, 4)), r"v_pair .* with B=1"),
        (dict(v=None, v_pair=torch.randn(8, 8, 4)), r"v_pair \(8, 8, 4\)"),
    ],
)
def test_bad_inputs_are_named(change, match):
    x = RelationalProblem().inputs()
    with pytest.raises(ValueError, match=match):
        relational_attention(**{**x, **change})


def test_auto_prefers_the_tiled_kernels_on_cpu_and_sdpa_augmentation_on_cuda():
    from attn_zoo.kernels.dispatch import Call, family

    plain = frozenset({"grad", "causal"})
    best_cpu = "chunked" if cpp_missing() else "cpp"
    assert family("relational").select("auto", Call("cpu", torch.float32, plain)).name == best_cpu
    for call in (Call("cpu", torch.float64, plain), Call("cpu", torch.float32, plain | {"mask"})):
        assert family("relational").select("auto", call).name == "chunked"
    assert family("relational").select("auto", Call("cuda", torch.float32, plain)).name == "sdpa"
    relu = plain | {"rel_activation"}
    assert family("relational").select("auto", Call("cuda", torch.float32, relu)).name == "chunked"


EMPTY = [(0, 0), (0, 5), (5, 0)]


@pytest.mark.parametrize(("n", "m"), EMPTY)
@pytest.mark.parametrize("symbols", ["absolute", "relative", "pairwise"])
@pytest.mark.parametrize("causal", [False, True])
def test_no_queries_or_no_keys_on_every_backend(n, m, symbols, causal):
    """N = 0 gives an empty result, M = 0 zeros, on every backend serving the call (naive,
    chunked, and sdpa for absolute symbols; cpp refuses), gradients included, masked."""
    base = RelationalProblem(
        q_len=n, k_len=m, heads=4, kv_heads=2, is_causal=causal, mask="random",
        max_rel_pos=2 if symbols == "relative" else None,
        rel_activation="identity" if symbols == "absolute" else "softmax",
    )  # fmt: skip
    problem = PairProblem(base) if symbols == "pairwise" else base
    report = assert_backends_agree(problem, "relational")
    assert report["naive"] == report["chunked"] == "ok"
    assert (report["sdpa"] == "ok") == (symbols == "absolute")
    assert (
        "does not support" in report["cpp"]
        and ("no_keys" if m == 0 else "no_queries") in (report["cpp"])
    )
    x = problem.inputs()
    for backend in ("auto", "naive", "chunked"):
        out = relational_attention(**x, backend=backend)
        assert out.shape == (1, 4, n, 4 + 2)
        assert not out.any()
        out.sum().backward()  # no empty-tensor stride trouble in any backward


def test_auto_never_sends_an_empty_call_to_cpp():
    """cpp needs queries and keys (its backward rejects an empty dout): auto falls back."""
    relational = family("relational")
    for features in ({"grad", "no_queries"}, {"grad", "no_keys"}, {"no_keys", "no_queries"}):
        call = Call("cpu", torch.float32, frozenset(features))
        assert relational.select("auto", call).name == "chunked"
        assert relational.select("fused", call).name == "sdpa"
