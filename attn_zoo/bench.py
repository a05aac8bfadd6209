"""Speed and memory of attention backends, measured side by side in one run.

Each workload maps (N, grad) to a zero-argument `run` that computes one forward pass; the
bench times `run` (forward, under no_grad) and `run` + backward (forward+backward) as the
median of `repeats` after one warm-up, and measures the peak memory of one forward+backward:
on CUDA with torch's allocator statistics, on CPU as the rise of the process's peak resident
set (Linux: /proc/self/clear_refs resets it; during that one step glibc maps every block of
64 KiB or more on its own, so freed tensors leave the resident set and the peak is the live
peak; timings run with ordinary heap reuse).
Ratios to baseline backends are taken within
the same run, on the same machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import pandas as pd
import torch
from torch import nn

from attn_zoo.kernels.dispatch import UnsupportedCallError, family
from attn_zoo.kernels.softmax import softmax_attention

Run = Callable[[], torch.Tensor]
Workload = Callable[[int, bool], Run]


def machine() -> str:
    """One line naming the machine: CPU (or GPU), cores, torch version and threads."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"{cpu}, {os.cpu_count()} cores{gpu}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


@contextlib.contextmanager
def _freed_blocks_unmapped():
    """glibc: while inside, free heap memory is returned first, then blocks >= 64 KiB are
    served by mmap and trimmed at 64 KiB, so the resident set follows the live tensors;
    after, thresholds of 32 MiB / 64 MiB (glibc's dynamic ceiling) so that timed code reuses
    its heap as usual. No-op without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        yield
        return
    mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD
    mallopt(-1, 1 << 16)  # M_TRIM_THRESHOLD
    libc.malloc_trim(0)  # give back what the heap kept from earlier (timed) runs
    try:
        yield
    finally:
        mallopt(-3, 32 << 20)
        mallopt(-1, 64 << 20)


def peak_memory_mb(fn: Callable[[], object], device: str) -> float:
    """Peak memory fn() adds above what was in use before it, in MiB (NaN if unmeasurable)."""
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    try:
        with _freed_blocks_unmapped():
            before = _rss_kib("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak resident set (VmHWM) to the current one
            fn()
            return (_rss_kib("VmHWM") - before) / 1024
    except OSError:
        return float("nan")


def median_ms(fn: Callable[[], object], repeats: int, device: str) -> float:
    """Median wall time of fn() over `repeats` runs after one warm-up, in milliseconds."""
    times = []
    for i in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def forward_backward(run: Run) -> Callable[[], None]:
    def step():
        out = run()
        out.backward(torch.ones_like(out))

    return step


def softmax_workloads(
    backends: Sequence[str],
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    causal: bool = True,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> dict[str, Workload]:
    """One workload per softmax backend: attention of (batch, heads, N, head_dim) inputs."""

    def workload(backend: str) -> Workload:
        def make(n: int, grad: bool) -> Run:
            q, k, v = (
                torch.randn(
                    batch, heads, n, head_dim, dtype=dtype, device=device, requires_grad=grad
                )
                for _ in range(3)
            )
            return lambda: softmax_attention(q, k, v, is_causal=causal, backend=backend)

        return make

    return {b: workload(b) for b in backends}


def module_workloads(
    modules: dict[str, Callable[[], nn.Module]],
    d_model: int,
    batch: int = 1,
    causal: bool = True,
    symbols: bool = False,
    device: str = "cpu",
) -> dict[str, Workload]:
    """One workload per module factory: module(x[, symbols], is_causal) on (batch, N, d_model)
    inputs; a tuple output (the reference package's modules) is read at [0]."""

    def workload(factory: Callable[[], nn.Module]) -> Workload:
        def make(n: int, grad: bool) -> Run:
            torch.manual_seed(0)
            module = factory().to(device)
            module.requires_grad_(grad)
            x = torch.randn(batch, n, d_model, device=device, requires_grad=grad)
            args = (x, torch.randn(batch, n, d_model, device=device)) if symbols else (x,)

            def run():
                out = module(*args, is_causal=causal)
                return out[0] if isinstance(out, tuple) else out

            return run

        return make

    return {name: workload(factory) for name, factory in modules.items()}


def measure(
    workloads: dict[str, Workload],
    lengths: Sequence[int],
    repeats: int = 5,
    device: str = "cpu",
    baselines: Sequence[str] = ("naive", "sdpa"),
) -> pd.DataFrame:
    """A row per (workload, N): fwd_ms, fwd_bwd_ms, train_peak_mb, ratios to each baseline
    measured in this run (fwd_vs_, time_vs_ for fwd+bwd, mem_vs_ for training peak memory),
    and a note when a workload could not run."""
    rows = []
    for n in lengths:
        for name, make in workloads.items():
            row = {"backend": name, "N": n, "fwd_ms": float("nan"), "fwd_bwd_ms": float("nan"),
                   "train_peak_mb": float("nan"), "note": ""}  # fmt: skip
            try:
                with torch.no_grad():
                    run = make(n, False)
                    row["fwd_ms"] = median_ms(run, repeats, device)
                step = forward_backward(make(n, True))
                step()  # warm-up: one-time allocations are not the step's memory
                row["train_peak_mb"] = peak_memory_mb(step, device)
                row["fwd_bwd_ms"] = median_ms(step, repeats, device)
            except UnsupportedCallError as err:
                row["note"] = "; ".join(err.reasons.values())
            rows.append(row)
    table = pd.DataFrame(rows)
    for base in baselines:
        if base not in workloads:
            continue
        ref = table[table.backend == base].set_index("N")
        table[f"fwd_vs_{base}"] = table.fwd_ms / table.N.map(ref.fwd_ms)
        table[f"time_vs_{base}"] = table.fwd_bwd_ms / table.N.map(ref.fwd_bwd_ms)
        table[f"mem_vs_{base}"] = table.train_peak_mb / table.N.map(ref.train_peak_mb)
    return table[[c for c in table.columns if c != "note"] + ["note"]]


def bench_softmax(
    lengths: Sequence[int] = (256, 512, 1024, 2048, 4096),
    backends: Sequence[str] | None = None,
    repeats: int = 5,
    device: str = "cpu",
    **shape,
) -> pd.DataFrame:
    """Every softmax backend usable on `device` (or `backends`), over `lengths`."""
    if backends is None:
        fam = family("softmax")
        backends = [b for b in fam.backends if fam.backends[b].available() is None]
        backends = [b for b in backends if fam.status(b, device)[0]]
    return measure(softmax_workloads(backends, device=device, **shape), lengths, repeats, device)


def reference_package() -> str | None:
    """None if the `dual_attention` reference package imports, else why not."""
    try:
        import dual_attention  # noqa: F401
    except ImportError as err:
        return f"dual-attention is not installed (pip install 'attn_zoo[test]'): {err}"
    return None


def relational_modules(suite: str, d_model: int, heads: int) -> dict[str, Callable[[], nn.Module]]:
    """Module factories of the `relational` or `dual` suite: each of our backends, the
    reference package's module and a standard attention layer with the same heads on SDPA.

    relational: `heads` relational heads of width d_model / (2 heads), as the relational half
    of dual attention with `heads` + `heads` heads; dual: that dual attention.
    """
    from attn_zoo.registry import build, list_backends

    if suite == "relational":
        kwargs = dict(d_model=d_model, n_heads=heads, total_n_heads=2 * heads)
        standard = dict(d_model=d_model, n_heads=heads, total_n_heads=2 * heads)
    else:
        kwargs = dict(d_model=d_model, n_heads_sa=heads, n_heads_ra=heads)
        standard = dict(d_model=d_model, n_heads=2 * heads)
    modules = {b: (lambda b=b: build(suite, backend=b, **kwargs)) for b in list_backends(suite)}
    if reference_package() is None:
        if suite == "relational":
            from dual_attention.relational_attention import RelationalAttention

            modules["reference"] = lambda: RelationalAttention(**kwargs)
        else:
            from dual_attention.dual_attention import DualAttention

            modules["reference"] = lambda: DualAttention(**kwargs, dropout=0.0)
    modules["standard_sdpa"] = lambda: build("standard", backend="sdpa", **standard)
    return modules


def bench_relational(
    suite: str = "relational",
    lengths: Sequence[int] = (512, 1024, 2048, 4096),
    repeats: int = 3,
    d_model: int = 512,
    heads: int = 4,
    causal: bool = True,
    device: str = "cpu",
) -> pd.DataFrame:
    """Our relational or dual attention on every backend beside the reference package and a
    standard SDPA layer, ratios to both (time_vs_reference, time_vs_standard_sdpa, ...)."""
    modules = relational_modules(suite, d_model, heads)
    workloads = module_workloads(modules, d_model, causal=causal, symbols=True, device=device)
    return measure(workloads, lengths, repeats, device, baselines=("reference", "standard_sdpa"))
