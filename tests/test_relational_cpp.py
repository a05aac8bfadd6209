"""The C++ relational kernel (backend `cpp`) against the float64 naive reference.

Built on first use (about 15-30 s once per machine); where it cannot be built these tests are
skipped with the build's reason, and the fallback itself is tested in a child process.
"""

import functools
import os
import subprocess
import sys

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
