"""Relational attention as one fused C++ kernel on CPU (float32), compiled on first use.

The tiles of chunked.py, in C++ (cpp_kernel.cpp). Per (query block, key block) the R relation
tiles r^l = rel_scale qr^l kr^l^T are computed once for all heads; each head's scores go through
an online softmax, and p v and the (H x R) contraction sum_j p_ij^h r_ij^l accumulate in the
same pass over the tile. Backward recomputes the tiles, one key block per task (so each thread
owns its dk, dv, dkr rows; dq and dqr go to per-thread buffers):

    dp_ij = <dsym_i, v_j> + sum_l drel_i^{h,l} r_ij^l
    ds_ij = p_ij (dp_ij - D_i),  D_i = <dout_i, out_i>
    dr_ij^l = sum_h p_ij^h drel_i^{h,l}
    dqr^l += rel_scale dr^l kr^l,  dkr^l += rel_scale dr^l^T qr^l

Training memory O(N). Serves float32 CPU calls with identity rel_activation and absolute
symbols, causal or not, GQA, without mask or dropout. GEMMs go to the BLAS torch links
(sgemm_, MKL on x86 builds), else to at::mm. torch.utils.cpp_extension builds it (a C++
compiler with OpenMP, and ninja) into torch's extension cache, about 15 s the first time on a
machine; where the build fails, or ATTN_ZOO_NO_CPP=1, the backend reports itself unavailable
with the reason and `auto` takes the next one.

The kernel is two torch custom ops, attn_zoo::relational_cpu_forward -> (out, lse) and
attn_zoo::relational_cpu_backward -> (dq, dk, dv, dqr, dkr) (torch.library.custom_op around the
loaded extension's ops), with fake kernels (output shapes and dtypes) and the autograd formula
registered, so torch.compile(fullgraph=True) traces through it as one opaque call each way.
Whether the kernel is built is decided outside the traced graph (`cpp_missing` is a constant
to the compiler): the build happens when the first call, eager or traced, asks.
"""

import fcntl
import hashlib
import os
import platform
import re
import sys
import threading
from pathlib import Path

import torch

from attn_zoo.kernels.dispatch import Capabilities, constant_when_compiled, register_backend
from attn_zoo.kernels.relational.naive import default_scales

SOURCE = Path(__file__).with_name("cpp_kernel.cpp")
# (queries, keys) per tile in forward, then in backward; measured best on a 2-core Xeon at
# N=1024..4096 (non-causal forward 256 x 128 is ~4% faster than 128 x 256, causal ~3% slower)
BLOCKS = {True: (128, 256, 256, 128), False: (256, 128, 256, 128)}  # by is_causal
_state: dict = {}  # "ops" once built, or "error": why it cannot be
_build_lock = threading.Lock()  # one build per process, whichever thread asks first


def _build_tag() -> str:
    """A short hash of this CPU's model and feature flags and of torch's install folder: a
    build made with -march=native on another machine sharing the cache (a cluster's home
    directory) is never loaded here, and two environments sharing it (another venv, a test's
    stand-in site-packages) do not rebuild over each other's build (its compile command names
    torch's headers by their path, so ninja rebuilds whenever that path changes)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features"))]
        info = "".join(sorted(set(lines)))
    except OSError:
        info = platform.platform() + platform.processor()
    info += os.path.dirname(torch.__file__)
    return hashlib.sha1(info.encode()).hexdigest()[:8]


def extension_name() -> str:
    """The extension's name: one per torch version, torch install and CPU (`_build_tag`)."""
    torch_version = re.sub(r"\W", "_", torch.__version__)
    return f"attn_zoo_relational_cpu_torch{torch_version}_{_build_tag()}"


def build_directory(name: str) -> Path:
    """Where torch.utils.cpp_extension builds extension `name` on CPU: under
    $TORCH_EXTENSIONS_DIR, else under torch's default root in a folder per Python version."""
    from torch.utils.cpp_extension import get_default_build_root

    if root := os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(root) / name
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return Path(get_default_build_root()) / f"{python}_cpu" / name


def _build() -> None:
    if os.environ.get("ATTN_ZOO_NO_CPP") == "1":
        _state["error"] = "disabled by ATTN_ZOO_NO_CPP=1"
        return
    from torch.utils.cpp_extension import load

    name = extension_name()
    directory = build_directory(name)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # torch marks a build in progress with a file `lock` and waits, forever, while it
        # exists: a builder killed mid-build (SIGKILL, a timeout) left every later load hung.
        # Builders here first take an OS lock, which dies with its process: whoever holds it
        # knows any `lock` file is a dead builder's and removes it.
        with open(directory / "attn_zoo_build.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            (directory / "lock").unlink(missing_ok=True)
            load(
                name=name,
                sources=[str(SOURCE)],
                extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                is_python_module=False,
            )
    # the build runs a compiler, ninja and the dynamic loader: any failure means "unavailable"
    except Exception as err:  # noqa: BLE001
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        errors = [line for line in lines if "error:" in line or "not found" in line]
        errors = errors or lines[-1:]
        _state["error"] = f"building {SOURCE.name} failed ({type(err).__name__}): {errors[0]}"
        return
    _state["ops"] = torch.ops.attn_zoo_relational_cpu


@constant_when_compiled  # traced code takes the answer as a constant
def cpp_missing() -> str | None:
    """None once the C++ kernel is built and loaded (building it on the first call), else why
    it cannot be."""
    if not _state:
        with _build_lock:
            if not _state:
                _build()
    return _state.get("error")


def _ops():
    """The loaded kernel's ops (building it on first use); RuntimeError with the reason if it
    cannot be built."""
    if why := cpp_missing():
        raise RuntimeError(f"relational backend 'cpp' is unavailable: {why}")
    return _state["ops"]


def gemm_backend(aten: bool = False) -> str:
    """Which GEMM the kernel calls: "sgemm_" (torch's BLAS) or "at::mm" (aten=True forces it)."""
    return _ops().gemm_backend(aten)


def rows(t: torch.Tensor) -> torch.Tensor:
    """`t` itself if its last dim is contiguous (the kernel reads any other strides), else a
    contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


# The custom ops. Their bodies run the extension (never traced); the fakes give the compiler
# the outputs' shapes, dtypes and (contiguous) layout. Inputs are re-checked with `rows` inside
# the bodies: a compiled graph may hand an op other strides than eager code would.


@torch.library.custom_op("attn_zoo::relational_cpu_forward", mutates_args=(), device_types="cpu")
def _forward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qr: torch.Tensor,
    kr: torch.Tensor,
    is_causal: bool,
    scale: float,
    rel_scale: float,
    blocks: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, N, hd + R), lse (B, H, N)), both float32 and contiguous; `blocks`: the tile
    sizes of forward (the first two) and backward (the last two)."""
    q, k, v, qr, kr = (rows(t) for t in (q, k, v, qr, kr))
    return _ops().forward(q, k, v, qr, kr, is_causal, scale, rel_scale, *blocks[:2])


@_forward_op.register_fake
def _(q, k, v, qr, kr, is_causal, scale, rel_scale, blocks):
    (b, h, n, _), hd, r = q.shape, v.shape[3], qr.shape[1]
    return q.new_empty(b, h, n, hd + r), q.new_empty(b, h, n)


@torch.library.custom_op("attn_zoo::relational_cpu_backward", mutates_args=(), device_types="cpu")
def _backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qr: torch.Tensor,
    kr: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    is_causal: bool,
    scale: float,
    rel_scale: float,
    block_q: int,
    block_k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dqr, dkr), contiguous; delta_i = <dout_i, out_i> (B, H, N)."""
    q, k, v, qr, kr, dout = (rows(t) for t in (q, k, v, qr, kr, dout))
    lse, delta = lse.contiguous(), delta.contiguous()
    args = is_causal, scale, rel_scale, block_q, block_k
    return tuple(_ops().backward(q, k, v, qr, kr, dout, lse, delta, *args))


@_backward_op.register_fake
def _(q, k, v, qr, kr, dout, lse, delta, is_causal, scale, rel_scale, block_q, block_k):
    return tuple(t.new_empty(t.shape) for t in (q, k, v, qr, kr))


def _setup_context(ctx, inputs, output):
    q, k, v, qr, kr, is_causal, scale, rel_scale, blocks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, qr, kr, out, lse)
    ctx.args = is_causal, scale, rel_scale, *blocks[2:]


def _backward(ctx, dout, _dlse):
    q, k, v, qr, kr, out, lse = ctx.saved_tensors
    dout = rows(dout)
    delta = (dout * out).sum(-1)
    grads = _backward_op(q, k, v, qr, kr, dout, lse, delta, *ctx.args)
    return *grads, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


# The fastest backend on CPU where it builds.
@register_backend(
    "relational",
    "cpp",
    tier="fused",
    priority={"cpu": 50},
    available=cpp_missing,
    capabilities=Capabilities(
        frozenset({"grad", "causal", "gqa"}),
        devices=frozenset({"cpu"}),
        dtypes=frozenset({torch.float32}),
        why={
            "cuda": "the C++ kernel runs on CPU; on CUDA 'sdpa' and 'triton' serve",
            "mask": "the C++ kernel takes no attn_mask (causal only)",
            "dropout": "the C++ kernel has no dropout",
            "rel_activation": "the C++ kernel computes identity rel_activation only",
            "relative_symbols": "the C++ kernel reads absolute symbol values v, not v_rel",
            "no_keys": "the C++ kernel needs at least one key",
        },
    ),
    block_sizes=tuple(sorted(set(BLOCKS[True] + BLOCKS[False]))),
)
def cpp(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    qr: torch.Tensor,  # (B, R, N, dr)
    kr: torch.Tensor,  # (B, R, M, dr)
    v: torch.Tensor | None = None,  # (B, Hkv, M, hd)
    v_rel: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    rel_scale: float | None = None,
    rel_activation: str = "identity",
    dropout_p: float = 0.0,
    blocks: tuple[int, int, int, int] | None = None,  # default: BLOCKS[is_causal]
) -> torch.Tensor:  # (B, H, N, hd + R)
    """The raw kernel: relational_attention(..., backend="cpp") checks a call against the
    capabilities registered above; `blocks` (tile sizes) is this backend's own argument."""
    blocks = BLOCKS[bool(is_causal)] if blocks is None else tuple(blocks)
    if len(blocks) != 4 or min(blocks) < 1:
        raise ValueError(
            f"relational backend 'cpp': blocks={blocks} must be four positive tile sizes"
        )
    if why := cpp_missing():  # built, or the reason it cannot be
        raise RuntimeError(f"relational backend 'cpp' is unavailable: {why}")
    scale, rel_scale = default_scales(q, qr, scale, rel_scale)
    q, k, v, qr, kr = (rows(t) for t in (q, k, v, qr, kr))
    args = bool(is_causal), float(scale), float(rel_scale), list(blocks)
    return _forward_op(q, k, v, qr, kr, *args)[0]
