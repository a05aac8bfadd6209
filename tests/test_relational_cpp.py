"""The C++ relational kernel (backend `cpp`) against the float64 naive reference.

Built on first use (about 15-30 s once per machine); where it cannot be built these tests are
skipped with the build's reason, and the fallback itself is tested in a child process.
"""

import functools
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attn_zoo.kernels.relational import relational_attention
from attn_zoo.kernels.relational.cpp import cpp, cpp_missing, gemm_backend
from attn_zoo.testing import RelationalProblem, assert_backends_agree, relational_problems

needs_cpp = pytest.mark.skipif(cpp_missing() is not None, reason=f"cpp: {cpp_missing()}")
problems = functools.partial(
    relational_problems,
    rel_activations=("identity",),
    masks=("none",),
    relative=(False,),
    min_len=1,  # cpp serves no empty sequence (its capabilities say so)
    causal=(False, True),  # bottom-right with N != M arrives as a mask, which cpp does not take
)
tiles = st.tuples(*[st.sampled_from([1, 3, 8, 16])] * 4)


@needs_cpp
@given(problems())
def test_cpp_agrees_float32(problem):
    assert assert_backends_agree(problem, "relational", backends=["cpp"]) == {"cpp": "ok"}


@needs_cpp
@given(problems(max_len=40), tiles)
def test_cpp_many_tiles(problem, blocks):
    """Small tiles: partial tiles at the ends, tiles skipped above the causal diagonal, rows
    that see no key of a tile, and per-thread gradient buffers summed over key blocks."""
    kernel = functools.partial(cpp, blocks=blocks)
    report = assert_backends_agree(problem, "relational", backends=[], kernels={"cpp": kernel})
    assert report == {"cpp": "ok"}


@needs_cpp
@given(problems(max_len=40), tiles)
def test_cpp_aten_gemm(problem, blocks):
    """The same kernel with at::mm in place of the BLAS sgemm_ (the path of builds without it)."""
    default = gemm_backend()
    try:
        assert gemm_backend(aten=True) == "at::mm"
        kernel = functools.partial(cpp, blocks=blocks)
        assert_backends_agree(problem, "relational", backends=[], kernels={"cpp": kernel})
    finally:
        assert gemm_backend(aten=default == "at::mm") == default


@needs_cpp
@pytest.mark.parametrize("is_causal", [False, True])
def test_cpp_paper_widths_and_strided_inputs(is_causal):
    """Head width 64, 4 heads over 2 kv heads, 4 relations of width 32, N=300 (several tiles),
    inputs that are (B, N, H, d) projections viewed as (B, H, N, d), as the mechanisms pass them."""
    problem = RelationalProblem(
        batch=2, heads=4, kv_heads=2, n_relations=4, q_len=300, k_len=300, key_dim=64,
        rel_dim=32, head_dim=48, is_causal=is_causal, seed=3,
    )  # fmt: skip

    def strided(**x):
        for name in ("q", "k", "qr", "kr", "v"):
            x[name] = x[name].transpose(1, 2).contiguous().transpose(1, 2)
        assert not x["q"].is_contiguous()
        return cpp(**x)

    assert_backends_agree(problem, "relational", backends=[], kernels={"cpp": strided})


@needs_cpp
@pytest.mark.parametrize(
    "change, match",
    [
        ({"rel_activation": "relu"}, "identity rel_activation only"),
        ({"attn_mask": torch.ones(1, 1, 5, 5, dtype=torch.bool)}, "takes no attn_mask"),
        ({"dropout_p": 0.1}, "has no dropout"),
        ({"k_len": 0}, "needs at least one key"),
    ],
)
def test_cpp_refuses_by_its_declared_capabilities(change, match):
    """The refusal reasons come from the capabilities registered with the backend."""
    k_len = change.pop("k_len", 5)
    x = RelationalProblem(q_len=5, k_len=k_len).inputs()
    with pytest.raises(ValueError, match=f"'cpp'.*{match}"):
        relational_attention(**{**x, **change}, backend="cpp")


@needs_cpp
def test_cpp_checks_its_tile_sizes():
    x = RelationalProblem(q_len=5, k_len=5).inputs()
    with pytest.raises(ValueError, match="blocks=.*four positive tile sizes"):
        cpp(**x, blocks=(16, 0, 16, 16))


@needs_cpp
def test_cpp_refuses_other_dtypes_by_name():
    x = RelationalProblem(q_len=5, k_len=5).inputs(torch.float64)
    with pytest.raises(Exception, match="cpp.*dtype torch.float64 not supported"):
        relational_attention(**x, backend="cpp")


def test_without_the_extension_auto_falls_back_with_the_reason():
    """ATTN_ZOO_NO_CPP=1 stands for a machine where the build fails (no compiler)."""
    code = (
        "import torch, attn_zoo as az\n"
        "ok, why = az.backend_status('relational', 'cpp', device='cpu')\n"
        "print(ok, why)\n"
        "m = az.build('relational', d_model=16, n_heads=2, backend='auto')\n"
        "from attn_zoo.kernels.relational import describe_call, RELATIONAL\n"
        "x = torch.randn(1, 4, 2, 8)\n"
        "print(RELATIONAL.select('auto', describe_call(x, x, x, x, v=x)).name)\n"
    )
    env = {**os.environ, "ATTN_ZOO_NO_CPP": "1"}
    child = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    status, picked = child.stdout.strip().splitlines()
    assert status.startswith("False") and "disabled by ATTN_ZOO_NO_CPP=1" in status
    assert picked == "chunked"


@needs_cpp  # a compiler that works, given a source that does not compile
def test_a_failed_build_is_reported_with_the_compiler_error(tmp_path):
    """A source that does not compile (as with a broken or missing compiler): the backend is
    unavailable with the compiler's error line, and `auto` still serves the call."""
    broken = tmp_path / "broken.cpp"
    broken.write_text('#error "no usable compiler here"\n')
    code = (
        "import pathlib, sys, torch\n"
        "from attn_zoo.kernels.relational.cpp import cpp_missing\n"
        f"sys.modules['attn_zoo.kernels.relational.cpp'].SOURCE = pathlib.Path({str(broken)!r})\n"
        "print(cpp_missing())\n"
        "from attn_zoo.kernels.relational import relational_attention\n"
        "x = torch.randn(1, 2, 4, 8)\n"
        "print(relational_attention(x, x, x, x, v=x).shape)\n"
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    child = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    why, shape = child.stdout.strip().splitlines()[-2:]
    assert why.startswith("building broken.cpp failed") and "no usable compiler here" in why
    assert shape == "torch.Size([1, 2, 4, 10])"


@needs_cpp
def test_a_lock_left_by_a_dead_builder_does_not_hang_the_build(tmp_path):
    """torch's `lock` file in the build folder, as a builder killed mid-build leaves it: the
    next build goes ahead (here a source that does not compile, so it ends in seconds with the
    compiler's error) instead of waiting for the file to go."""
    broken = tmp_path / "broken.cpp"
    broken.write_text('#error "built, not hung"\n')
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    code = (
        "import pathlib, sys\n"
        "from attn_zoo.kernels.relational import cpp\n"
        "folder = cpp.build_directory(cpp.extension_name())\n"
        "folder.mkdir(parents=True)\n"
        "(folder / 'lock').touch()\n"
        f"cpp.SOURCE = pathlib.Path({str(broken)!r})\n"
        "print(cpp.cpp_missing())\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "built, not hung" in child.stdout, child.stderr[-2000:]


@pytest.mark.slow  # two builds of the kernel: about 30 s
@needs_cpp
def test_a_builder_killed_mid_build_does_not_hang_the_next(tmp_path):
    """A process SIGKILLed while it builds the kernel leaves torch's `lock` file behind (torch
    waits forever while it exists): the next process still builds and loads the kernel."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    code = "from attn_zoo.kernels.relational.cpp import cpp_missing; print(cpp_missing())"
    builder = subprocess.Popen([sys.executable, "-c", code], env=env)
    lock = tmp_path / "extensions"
    deadline = time.monotonic() + 120
    while not list(lock.glob("*/lock")) and builder.poll() is None:
        assert time.monotonic() < deadline, "the first build never started"
        time.sleep(0.05)
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    assert list(lock.glob("*/lock")), "the killed builder left no lock: nothing was tested"
    child = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.stdout.strip() == "None", child.stderr[-2000:]


@needs_cpp
@pytest.mark.parametrize("threads", [1, 3])
def test_cpp_any_thread_count(threads):
    """One thread (the ablation workers' setting) and more threads than cores: every task is
    taken once and every per-thread gradient buffer is summed."""
    problem = RelationalProblem(
        batch=2, heads=4, kv_heads=2, n_relations=3, q_len=45, k_len=45, key_dim=8, rel_dim=8,
        head_dim=8, is_causal=True, seed=5,
    )  # fmt: skip
    kernel = functools.partial(cpp, blocks=(8, 16, 16, 8))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert_backends_agree(problem, "relational", backends=[], kernels={"cpp": kernel})
    finally:
        torch.set_num_threads(before)


def kernel_inputs(is_causal, requires_grad=False, seed=7):
    """q, k, v, qr, kr of a GQA problem spanning several tiles (blocks (8, 16, 16, 8))."""
    problem = RelationalProblem(
        batch=2, heads=4, kv_heads=2, n_relations=3, q_len=37, k_len=37, key_dim=8, rel_dim=8,
        head_dim=6, is_causal=is_causal, seed=seed,
    )  # fmt: skip
    x = problem.inputs()
    return {name: x[name].detach().requires_grad_(requires_grad) for name in TENSORS}


TENSORS = ("q", "k", "v", "qr", "kr")
BLOCKS = (8, 16, 16, 8)


@needs_cpp
@pytest.mark.parametrize("is_causal", [False, True])
def test_cpp_custom_op_is_the_extension_bit_for_bit(is_causal):
    """cpp() through the custom ops and their autograd gives the extension's own numbers: out
    and every gradient equal to calling its forward and backward directly (one thread: with
    more, the per-thread dq buffers are summed in the order threads take tasks)."""
    from attn_zoo.kernels.relational.cpp import _state

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = kernel_inputs(is_causal, requires_grad=True)
        out = cpp(**x, is_causal=is_causal, blocks=BLOCKS)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        out.backward(dout)
        ext = _state["ops"]
        scale, rel_scale = x["q"].shape[-1] ** -0.5, x["qr"].shape[-1] ** -0.5
        args = is_causal, scale, rel_scale
        raw = [t.detach() for t in (x["q"], x["k"], x["v"], x["qr"], x["kr"])]
        ref, lse = ext.forward(*raw, *args, *BLOCKS[:2])
        grads = ext.backward(*raw, dout, lse, (dout * ref).sum(-1), *args, *BLOCKS[2:])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out.detach(), ref)
    for name, grad in zip(TENSORS, grads, strict=True):
        assert torch.equal(x[name].grad, grad), name


@needs_cpp
def test_cpp_custom_ops_pass_opcheck():
    """torch.library.opcheck: schema, fake kernels against the real ones (shapes, dtypes,
    strides), the autograd registration, and tracing with dynamic shapes."""
    from attn_zoo.kernels.relational.cpp import _backward_op, _forward_op

    x = kernel_inputs(is_causal=True, requires_grad=True)
    args = tuple(x[name] for name in TENSORS)
    forward_args = (*args, True, 0.35, 0.5, list(BLOCKS))
    torch.library.opcheck(_forward_op, forward_args)
    out, lse = _forward_op(*(t.detach() for t in args), True, 0.35, 0.5, list(BLOCKS))
    dout = torch.randn_like(out)
    plain = tuple(t.detach() for t in args)
    backward_args = (*plain, dout, lse, (dout * out).sum(-1), True, 0.35, 0.5, *BLOCKS[2:])
    torch.library.opcheck(_backward_op, backward_args)


@needs_cpp
@pytest.mark.parametrize("is_causal", [False, True])
def test_cpp_compiles_fullgraph_with_strided_inputs(is_causal):
    """relational_attention(backend="cpp") under torch.compile(fullgraph=True): one graph with
    the custom ops in it, the same outputs and gradients as eager, inputs viewed from (B, N, H,
    d) projections as the mechanisms pass them."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def attend(q, k, v, qr, kr):
        q, k, v, qr, kr = (t.transpose(1, 2) for t in (q, k, v, qr, kr))
        return relational_attention(q, k, qr, kr, v=v, is_causal=is_causal, backend="cpp")

    x = kernel_inputs(is_causal)
    inputs = [x[name].transpose(1, 2).contiguous().requires_grad_() for name in TENSORS]
    out = attend(*inputs)
    out.backward(torch.ones_like(out))
    grads = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager_decomp_partition")
    compiled = torch.compile(attend, fullgraph=True, backend=counter)
    c_out = compiled(*inputs)
    c_out.backward(torch.ones_like(c_out))
    assert counter.frame_count == 1
    torch.testing.assert_close(c_out, out, atol=1e-5, rtol=1e-4)
    for t, grad in zip(inputs, grads, strict=True):
        torch.testing.assert_close(t.grad, grad, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "no_cpp",
    ["0", pytest.param("1", marks=pytest.mark.slow)],  # the fallback's reason, uncompiled:
)  # test_without_the_extension_auto_falls_back_with_the_reason (default suite)
def test_a_compiled_first_call_builds_or_falls_back(no_cpp):
    """The first call of a process is a compiled one: the availability check runs at trace time
    (building or loading the kernel, or finding why not), and `auto` traces the backend it
    picks: cpp where it builds, else chunked (ATTN_ZOO_NO_CPP=1)."""
    code = (
        "import torch\n"
        "from attn_zoo.kernels.dispatch import recording_choices\n"
        "from attn_zoo.kernels.relational import relational_attention\n"
        "q, k, v, qr, kr = torch.randn(5, 1, 2, 5, 8, requires_grad=True).unbind(0)\n"
        "f = torch.compile(lambda *x: relational_attention(*x[:4], v=x[4], is_causal=True),\n"
        "                  fullgraph=True, backend='aot_eager')\n"
        "with recording_choices() as choices:\n"
        "    f(q, k, qr, kr, v).sum().backward()\n"
        "from attn_zoo.kernels.relational.cpp import cpp_missing\n"
        "print(choices[0].chosen, cpp_missing())\n"
    )
    env = {**os.environ, "ATTN_ZOO_NO_CPP": no_cpp}
    child = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-3000:]
    chosen, why = child.stdout.strip().splitlines()[-1].split(" ", 1)
    if no_cpp == "1":
        assert (chosen, why) == ("chunked", "disabled by ATTN_ZOO_NO_CPP=1")
    else:
        assert (chosen, why) == ("cpp", "None") if cpp_missing() is None else chosen == "chunked"
