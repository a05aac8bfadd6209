"""Every softmax backend against the float64 naive reference, outputs and gradients."""

import dataclasses
import functools
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from allocations import largest_allocation
from hypothesis import given
from hypothesis import strategies as st

from attn_zoo.kernels import UnsupportedCallError, softmax_attention
from attn_zoo.kernels.dispatch import Call, family
from attn_zoo.kernels.softmax.chunked import BLOCK, chunked
from attn_zoo.kernels.softmax.masks import saturated
from attn_zoo.testing import (
    MASK_KINDS,
    AttentionProblem,
    assert_backends_agree,
    attention_problems,
)

GRAD_BACKENDS = ["naive", "chunked", "sdpa"]
# torch's CPU flash kernel (sdpa) splits queries in blocks of 32 (N < 192), 64 (N < 768) or
# 256, and keys in blocks of 512; chunked tiles by BLOCK (256)
SDPA_QUERY_SPLIT = 32


def assert_grad_backends_agree(problem: AttentionProblem) -> None:
    """Each of GRAD_BACKENDS agrees with the float64 reference; sdpa declines a backward
    through rows masked by float32's min only (saturated_mask: SDPA keeps lse = m + log l)."""
    report = assert_backends_agree(problem)
    backward = set(problem.frozen) != {"q", "k", "v"}
    declined = {"sdpa"} if backward and saturated(problem.inputs()["attn_mask"]) else set()
    assert {b for b in GRAD_BACKENDS if report[b] == "ok"} == set(GRAD_BACKENDS) - declined


@given(attention_problems(block_sizes=(SDPA_QUERY_SPLIT, BLOCK)))
def test_backends_agree_float32(problem):
    assert_grad_backends_agree(problem)


# (N, M) one short of, at, one over and several blocks past each backend's blocks (see above):
# 32 and 65 (sdpa, N < 192), 255-257 (chunked; sdpa's 64-query split), 513 (chunked 2 blocks
# + 1, sdpa's 512-key split + 1)
BOUNDARIES = [(1, 33), (31, 32), (33, 65), (65, 31), (255, 256), (256, 256), (257, 513), (513, 255)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "m"), BOUNDARIES)
def test_every_backend_agrees_around_its_block_boundaries(n, m, threads):
    """Every backend serving the call, outputs and grads, with 1 and 2 torch threads (a
    shape- and thread-dependent error, like FlexAttention's CPU path at N = 40, shows here);
    mask kind and causality vary with the case."""
    case = BOUNDARIES.index((n, m))
    problem = AttentionProblem(
        batch=1, heads=2, kv_heads=1, q_len=n, k_len=m, key_dim=8, value_dim=8,
        mask=MASK_KINDS[case % len(MASK_KINDS)], is_causal=(False, True, "bottom_right")[case % 3],
        seed=case, threads=threads,
    )  # fmt: skip
    assert_grad_backends_agree(problem)


@given(attention_problems(dtypes=(torch.float64,)))
def test_backends_agree_float64(problem):
    assert_grad_backends_agree(problem)


@given(
    attention_problems(
        dtypes=(torch.float16, torch.bfloat16), max_len=40, max_width=8, scales=st.none()
    )
)
def test_backends_agree_half_precision(problem):
    """At the default scale 1/sqrt(width). With drawn scales up to 2 on widths of 1-2, torch
    SDPA's own bfloat16 arithmetic exceeds the bfloat16 tolerance (seen: grad q off by 0.07)."""
    assert_grad_backends_agree(problem)


@given(attention_problems(max_len=70, max_width=6), st.sampled_from([1, 3, 8, 16]))
def test_chunked_multi_tile(problem, block):
    """Small blocks: many tiles, partial last tiles, causal tiles skipped and cut."""
    assert_backends_agree(
        problem,
        backends=[],
        kernels={"chunked": functools.partial(chunked, block=block)},
        kernel_features=family("softmax").backends["chunked"].capabilities.features,
    )


FLEX_CPU_REASON = "FlexAttention's CPU path gives wrong results"


def test_flex_is_refused_on_cpu_with_the_reason():
    """FlexAttention's CPU kernel was wrong at (1, 2, 40, 8) with 2 threads (off by up to 0.7,
    or NaN): flex serves CUDA only, `auto` and `fused` never pick it on CPU, and asking for it
    names the reason and the backends that can."""
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    with pytest.raises(UnsupportedCallError, match=rf"'flex'.*{FLEX_CPU_REASON}.*can: .*sdpa"):
        softmax_attention(q, k, v, backend="flex")
    softmax = family("softmax")
    for features in (frozenset(), frozenset({"mask", "causal"}), frozenset({"grad"})):
        call = Call("cpu", torch.float32, features)
        assert FLEX_CPU_REASON in softmax.backends["flex"].refusal(call)
        assert {softmax.select(name, call).name for name in ("auto", "fused")} == {"sdpa"}
    assert softmax.backends["flex"].capabilities.refusal(Call("cuda", torch.float32)) is None
    dropout = Call("cuda", torch.float32, frozenset({"dropout"}))
    assert "dropout" in softmax.backends["flex"].capabilities.refusal(dropout)


def run_isolated(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh Python (a crash there, e.g. SIGFPE, cannot take pytest down)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_every_backend_serving_the_flex_repro_shape_agrees_with_two_threads():
    """The shape and thread count where FlexAttention's CPU path was wrong: every backend that
    accepts the call (outputs; grads for those with a backward) matches float64 naive, and flex
    is skipped for its CPU refusal."""
    result = run_isolated(
        """
        import json
        import torch
        torch.set_num_threads(2)
        from attn_zoo.testing import AttentionProblem, assert_backends_agree
        problem = AttentionProblem(batch=1, heads=2, kv_heads=2, q_len=40, k_len=40,
                                   key_dim=8, value_dim=8)
        print(json.dumps(assert_backends_agree(problem, grads=False)))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["sdpa"] == report["chunked"] == "ok"
    assert FLEX_CPU_REASON in report["flex"]


def test_flex_with_no_keys_or_queries_never_reaches_the_kernel():
    """M = 0 killed the process with SIGFPE inside torch's kernel; the raw flex function (no
    dispatch, on CPU) returns the contract's zeros without compiling or calling it."""
    result = run_isolated(
        """
        import torch
        from attn_zoo.kernels.softmax import flex
        for n, m in ((4, 0), (0, 4), (0, 0)):
            q, k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, m, 8), torch.randn(1, 2, m, 5)
            out = flex.flex(q, k, v)
            assert out.shape == (1, 2, n, 5) and not out.any(), (n, m, out)
        assert flex._compiled_flex.cache_info().currsize == 0
        print("ok")
        """
    )
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr[-3000:]


def test_default_reports_every_backend_with_skip_reasons():
    report = assert_backends_agree(AttentionProblem(mask="empty_rows", is_causal=True))
    assert {report[b] for b in GRAD_BACKENDS} == {"ok"}
    assert FLEX_CPU_REASON in report["flex"]
    assert "no CPU kernels" in report["xformers"]


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
def test_row_with_no_key_gives_zeros_and_finite_grads(backend):
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[1] = False
    out = softmax_attention(q, k, v, attn_mask=mask, backend=backend)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert all(g.isfinite().all() for g in grads)
    assert torch.equal(grads[0][:, :, 1], torch.zeros_like(grads[0][:, :, 1]))


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
def test_length_one(backend):
    q, k, v = (torch.randn(2, 3, 1, 4) for _ in range(3))
    out = softmax_attention(q, k, v, is_causal=True, backend=backend)
    torch.testing.assert_close(out, v)  # one key: weight 1


def test_causal_is_top_left_aligned():
    """With fewer queries than keys, query i still sees keys 0..i only (torch SDPA's rule)."""
    q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4)
    for backend in GRAD_BACKENDS:
        out = softmax_attention(q, k, v, is_causal=True, backend=backend)
        torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
def test_dropout_is_unbiased(backend):
    """E[out] under dropout equals the output without it (weights scaled by 1/(1-p))."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    exact = softmax_attention(q, k, v, backend="naive")
    draws = torch.stack(
        [softmax_attention(q, k, v, dropout_p=0.3, backend=backend) for _ in range(3000)]
    )
    assert not torch.allclose(draws[0], exact)  # dropout acted
    torch.testing.assert_close(draws.mean(0), exact, atol=0.05, rtol=0)


def test_chunked_dropout_backward_redraws_the_forward_masks():
    """gradcheck: the analytic backward uses the same dropout masks as the forward."""
    q, k, v = (torch.randn(1, 2, 7, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def fn(q, k, v):
        torch.manual_seed(1)
        return chunked(q, k, v, is_causal=True, dropout_p=0.4, block=3)

    assert torch.autograd.gradcheck(fn, (q, k, v))


MASK_SHAPES = [(2, 4, 7, 9), (1, 1, 7, 9), (2, 1, 1, 9), (7, 1), (7, 9)]


def float_mask(shape, seed: int) -> torch.Tensor:
    """An additive float64 mask of `shape`: values in [-2, 2], about a fifth -inf."""
    gen = torch.Generator().manual_seed(seed)
    bias = 4 * torch.rand(shape, generator=gen, dtype=torch.float64) - 2
    return bias.masked_fill(torch.rand(shape, generator=gen) < 0.2, float("-inf"))


@pytest.mark.parametrize("shape", MASK_SHAPES)
@pytest.mark.parametrize("is_causal", [False, True, "bottom_right"])
def test_chunked_gives_a_float_mask_its_gradient(shape, is_causal):
    """A float mask requiring grad gets d out / d mask (the score gradient, summed over the
    dims it broadcasts), as naive's autograd gives it: float32 chunked in 3-wide tiles and as
    the family runs it, against float64 naive; grads atol 5e-5 / rtol 1e-4."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 7, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 9, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = float_mask(shape, seed=4)
    cotangent = torch.randn(2, 4, 7, 4, generator=gen, dtype=torch.float64)

    def grads(fn, dtype):
        leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v, mask)]
        out = fn(*leaves)
        assert out.isfinite().all()
        return torch.autograd.grad(out, leaves, cotangent.to(dtype))

    want = grads(
        lambda *x: softmax_attention(*x, is_causal=is_causal, backend="naive"), torch.float64
    )
    tiled = functools.partial(chunked, block=3)
    for fn in (tiled, chunked):
        got = grads(
            lambda *x, fn=fn: fn(**family("softmax").check(*x, is_causal=is_causal)),
            torch.float32,
        )
        for name, g, w in zip(("q", "k", "v", "mask"), got, want, strict=True):
            assert g.shape == w.shape and g.isfinite().all(), name
            torch.testing.assert_close(g.double(), w, atol=5e-5, rtol=1e-4, msg=name)
    assert want[3].abs().sum() > 0  # the mask's gradient is not trivially zero


def test_chunked_float_mask_gradient_passes_gradcheck_with_dropout():
    """float64 gradcheck of q, k, v and a broadcast (B, 1, 1, M) mask, dropout redrawn."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 7, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = 4 * torch.rand(2, 1, 1, 7, generator=gen, dtype=torch.float64) - 2
    leaves = tuple(t.requires_grad_(True) for t in (q, k, v, mask))

    def fn(q, k, v, mask):
        torch.manual_seed(1)
        return chunked(q, k, v, attn_mask=mask, is_causal=True, dropout_p=0.3, block=3)

    assert torch.autograd.gradcheck(fn, leaves)


def largest_saved_tensor(fn) -> int:
    """Elements in the largest tensor autograd keeps for backward while running fn()."""
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: sizes.append(t.numel()) or t, lambda t: t
    ):
        fn()
    return max(sizes)


def test_chunked_saves_no_quadratic_tensor():
    """Training memory O(N x block): nothing of N x N elements is kept for backward."""
    n = 512
    q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
    for backend, quadratic in (("naive", True), ("chunked", False)):
        largest = largest_saved_tensor(
            lambda b=backend: softmax_attention(q, k, v, is_causal=True, backend=b)
        )
        assert (largest >= n * n) == quadratic, (backend, largest)


@pytest.mark.parametrize(("n", "m"), [(64, 4096), (4096, 64)])
def test_chunked_bottom_right_allocates_no_n_by_m_tensor(n, m):
    """O(N) memory for bottom-right causality as for top-left: forward and backward allocate
    nothing of N x M / 4 elements (the explicit causal mask it used to get was N x M); naive
    does, so the probe can fail."""
    q = torch.randn(1, 1, n, 8, requires_grad=True)
    k, v = (torch.randn(1, 1, m, 8, requires_grad=True) for _ in range(2))

    def run(backend):
        out = softmax_attention(q, k, v, is_causal="bottom_right", backend=backend)
        out.sum().backward()

    assert largest_allocation(lambda: run("naive")) >= n * m
    assert largest_allocation(lambda: run("chunked")) < n * m // 4


@pytest.mark.parametrize(("n", "m"), [(7, 17), (17, 7), (2, 9), (9, 9)])
@pytest.mark.parametrize("mask", ["none", "additive", "key_padding"])
def test_chunked_bottom_right_in_tiles(n, m, mask):
    """Bottom-right causality applied per 3-wide tile (tiles wholly masked skipped, rows
    before the first key empty when N > M) against float64 naive, outputs and grads."""
    problem = AttentionProblem(q_len=n, k_len=m, mask=mask, is_causal="bottom_right", seed=n)
    report = assert_backends_agree(
        problem,
        backends=["chunked"],
        kernels={"tiles": functools.partial(chunked, block=3)},
        kernel_features=family("softmax").backends["chunked"].capabilities.features,
    )
    assert report == {"tiles": "ok", "chunked": "ok"}


def test_auto_and_fused_pick_sdpa_on_cpu():
    from attn_zoo.kernels.dispatch import family
    from attn_zoo.kernels.softmax import describe_call

    q, k, v = (torch.randn(1, 2, 4, 4, requires_grad=True) for _ in range(3))
    call = describe_call(q, k, v)
    assert family("softmax").select("auto", call).name == "sdpa"
    assert family("softmax").select("fused", call).name == "sdpa"


def test_forcing_a_backend_that_cannot_serve_names_reason_and_alternatives():
    q, k, v = (torch.randn(1, 2, 4, 4, requires_grad=True) for _ in range(3))
    with pytest.raises(UnsupportedCallError, match=rf"'flex'.*{FLEX_CPU_REASON}.*can: .*sdpa"):
        softmax_attention(q, k, v, backend="flex")
    with pytest.raises(UnsupportedCallError, match=r"xformers.*no CPU kernels"):
        softmax_attention(q, k, v, backend="xformers")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            dict(attn_mask=torch.ones(4, 4, dtype=torch.long)),
            "attn_mask must be boolean .* or float",
        ),
        (dict(is_causal="bottom"), "is_causal='bottom': use False, True .top-left. or one of"),
        (
            dict(attn_mask=torch.ones(3, 4, dtype=torch.bool)),
            r"attn_mask shape \(3, 4\) does not broadcast",
        ),
        (dict(k=torch.randn(1, 3, 4, 4), v=torch.randn(1, 3, 4, 4)), "multiple of kv heads 3"),
        (dict(k=torch.randn(1, 2, 4, 5)), "q width 4 != k width 5"),
        (dict(q=torch.randn(2, 4, 4)), "q must be 4-D"),
        (dict(dropout_p=1.0), r"dropout_p=1.0: must be in \[0, 1\)"),
        (dict(backend="sdpx"), "Did you mean 'sdpa'"),
    ],
)
def test_bad_inputs_are_named(change, match):
    args = dict(q=torch.randn(1, 2, 4, 4), k=torch.randn(1, 2, 4, 4), v=torch.randn(1, 2, 4, 4))
    with pytest.raises(ValueError, match=match):
        softmax_attention(**{**args, **change})


def test_problem_rejects_bad_fields():
    with pytest.raises(ValueError, match="mask='diag'"):
        AttentionProblem(mask="diag")
    with pytest.raises(ValueError, match="kv_heads=2"):
        dataclasses.replace(AttentionProblem(), heads=3)
