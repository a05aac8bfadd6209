"""Measuring speed and memory of attention backends, side by side in one run.

A `Workload` is plain data naming what to run: a softmax kernel backend, one of our
mechanisms on a backend, or a module of another package (the reference). For each sequence
length N the bench times one forward pass (under no_grad) and one forward+backward, as the
median of `repeats` after a warm-up, the repeats taken in turns over the workloads (so a
drift in the machine's speed hits them alike), and measures the peak memory of one forward+backward
after a warm-up step: on CUDA from torch's allocator statistics, on CPU in a fresh Python
process (so earlier work cannot hide or inflate it) as the rise of the peak resident set
(Linux /proc/self/clear_refs), with glibc told to map every block of 64 KiB or more on its own
so that the peak resident set follows the live tensors. Ratios to the baselines are taken
within the same run, on the same machine.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from ablations.steps import Steps
from attn_zoo.kernels.dispatch import UnsupportedCallError
from attn_zoo.kernels.softmax import build_mod, softmax_attention
from attn_zoo.kernels.softmax.mods import mask_from_mod

Run = Callable[[], torch.Tensor]


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


@dataclass(frozen=True)
class Workload:
    """What to run, as plain data (a fresh process rebuilds it to measure memory).

    source "softmax": softmax_attention on (batch, heads, N, head_dim) tensors, `target` the
    backend (with kwargs window = w and window_as = "mod" or "mask": a causal sliding window
    of w keys as a mask mod, or the same mask as a dense (N, N) boolean tensor, built before
    the timing); "mechanism": attn_zoo.build(target, backend=backend, **kwargs) on (1, N, d_model)
    inputs; "module": the class at dotted path `target` built with kwargs. Mechanisms and
    modules get random symbols too when `symbols`; a tuple output is read at [0]. Inputs,
    parameters and symbols are of `dtype` (a torch dtype's name).
    """

    label: str
    source: str
    target: str
    kwargs: dict = field(default_factory=dict)
    backend: str = "auto"
    causal: bool = True
    symbols: bool = False
    dtype: str = "float32"

    def make(self, n: int, grad: bool, device: str = "cpu") -> Run:
        torch.manual_seed(0)
        dtype = getattr(torch, self.dtype)
        if self.source == "softmax":
            shape = self.kwargs
            q, k, v = (
                torch.randn(shape["batch"], shape["heads"], n, shape["head_dim"], dtype=dtype,
                            device=device, requires_grad=grad)
                for _ in range(3)
            )  # fmt: skip
            window = sliding_window_call(shape, n, device)
            return lambda: softmax_attention(
                q, k, v, is_causal=self.causal, backend=self.target, **window
            )
        module = self.module().to(device, dtype).requires_grad_(grad)
        d_model = self.kwargs["d_model"]
        x = torch.randn(1, n, d_model, dtype=dtype, device=device, requires_grad=grad)
        symbols = torch.randn(1, n, d_model, dtype=dtype, device=device)
        args = (x, symbols) if self.symbols else (x,)

        def run():
            out = module(*args, is_causal=self.causal)
            return out[0] if isinstance(out, tuple) else out

        return run

    def module(self) -> torch.nn.Module:
        if self.source == "mechanism":
            from attn_zoo.mechanisms.registry import build

            return build(self.target, backend=self.backend, **self.kwargs)
        path, name = self.target.rsplit(".", 1)
        return getattr(importlib.import_module(path), name)(**self.kwargs)


def sliding_window_call(shape: dict, n: int, device: str) -> dict:
    """The softmax_attention kwargs of a sliding-window workload (see `Workload`), or {}."""
    if shape.get("window") is None:
        return {}
    mod = build_mod({"name": "sliding_window", "window": shape["window"]})
    if shape["window_as"] == "mod":
        return {"mask_mod": mod}
    return {"attn_mask": mask_from_mod(mod, 1, 1, n, n, device)[0, 0]}


def forward_backward(run: Run) -> Callable[[], None]:
    def step():
        out = run()
        out.backward(torch.ones_like(out))

    return step


def on_cuda(device: str) -> bool:
    """Whether `device` is a CUDA device: "cuda" or "cuda:N"."""
    return torch.device(device).type == "cuda"


def check_lengths(lengths: Sequence[int], name: str = "lengths") -> None:
    """ValueError naming `name` unless `lengths` is a non-empty list of distinct N >= 1 (a table
    holds one row per backend and N)."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"{name} {list(lengths)}: give one or more lengths N >= 1")
    if repeated := sorted({n for n in lengths if list(lengths).count(n) > 1}):
        raise ValueError(f"{name} {list(lengths)}: each length once (repeated: {repeated})")


def wall_ms(fn: Callable[[], object], device: str) -> float:
    """Wall time of one fn() call in milliseconds (on CUDA, synchronised)."""
    if on_cuda(device):
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if on_cuda(device):
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def interleaved_median_ms(
    fns: dict[str, Callable[[], object]], repeats: int, device: str
) -> dict[str, float]:
    """Median wall time in ms of each of `fns` (warmed up by the caller) over `repeats`
    rounds, each round running every fn once in turn: a drift in the machine's speed (a
    shared VM) then hits every fn alike, and the ratios between them stay fair."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(wall_ms(fn, device))
    return {name: statistics.median(ms) for name, ms in times.items()}


def forward_only(run: Run) -> Callable[[], None]:
    """`run` under no_grad: the forward pass alone."""

    def forward():
        with torch.no_grad():
            run()

    return forward


def _status_kib(name: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(name))


def peak_memory_mb(fn: Callable[[], object], device: str = "cpu") -> float:
    """Peak memory fn() adds above what was in use before it, in MiB (NaN if unmeasurable).

    CUDA ("cuda", "cuda:N"): rise of the allocator's peak on `device`. CPU: rise of this
    process's peak resident set; call it in a fresh process (see `isolated_peak_memory_mb`)
    for numbers independent of earlier work.
    """
    if on_cuda(device):
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    try:
        before = _status_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set (VmHWM) to the current one
        fn()
        rise = (_status_kib("VmHWM") - before) / 1024
    except (OSError, StopIteration):
        return float("nan")
    return rise if rise >= 0 else float("nan")  # pages freed below the start: unmeasurable


def _map_large_blocks() -> None:
    """glibc: serve blocks >= 64 KiB by mmap and trim at 64 KiB (no-op without glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 16)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _memory_child() -> None:
    """Entry point of the fresh process: read a request on stdin, print the peak in MiB."""
    _map_large_blocks()
    request = json.loads(sys.stdin.read())
    torch.set_num_threads(request["threads"])
    step = forward_backward(Workload(**request["workload"]).make(request["n"], True))
    step()  # warm-up: one-time allocations are not the step's memory
    print(json.dumps(peak_memory_mb(step)))


def isolated_peak_memory_mb(workload: Workload, n: int) -> float:
    """Training peak memory of one forward+backward of `workload` at N=n, measured on CPU in
    a fresh Python process; raises RuntimeError with the child's error if it fails."""
    request = {"workload": asdict(workload), "n": n, "threads": torch.get_num_threads()}
    child = subprocess.run(
        [sys.executable, "-c", f"from {__name__} import _memory_child; _memory_child()"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode:
        raise RuntimeError(
            f"memory measurement of {workload.label} at N={n} failed:\n{child.stderr}"
        )
    return float(json.loads(child.stdout.strip().splitlines()[-1]))


def measure(
    workloads: Sequence[Workload],
    lengths: Sequence[int],
    repeats: int = 5,
    device: str = "cpu",
    baselines: Sequence[str] = ("naive", "sdpa"),
    memory: bool = True,
    progress: Steps | None = None,
) -> pd.DataFrame:
    """A row per (workload, N): fwd_ms, fwd_bwd_ms, train_peak_mb, ratios to each baseline
    label measured in this run (fwd_vs_, time_vs_ for fwd+bwd, mem_vs_ for training peak
    memory; memory=False skips measuring it), and a note when a workload could not run.

    At each N every workload runs once as a warm-up, then the timed repeats go round the
    workloads in turn (`interleaved_median_ms`). `progress` (ablations.steps) counts the
    measurements, workloads x lengths x (forward, fwd+bwd, memory), those a workload refused
    included; it is told between them, never while a workload is timed."""
    check_lengths(lengths)
    progress = progress or Steps()
    progress.expect(len(workloads) * len(lengths) * (3 if memory else 2))
    rows = []
    for n in lengths:
        table = {
            w.label: {"backend": w.label, "N": n, "fwd_ms": float("nan"),
                      "fwd_bwd_ms": float("nan"), "train_peak_mb": float("nan"), "note": ""}
            for w in workloads
        }  # fmt: skip
        forwards, steps = {}, {}
        for w in workloads:
            progress.doing(f"N={n} warm-up: {w.label}")
            try:  # the warm-up runs, which also find the calls a backend cannot serve
                forward = forward_only(w.make(n, False, device))
                forward()
                forwards[w.label] = forward
                step = forward_backward(w.make(n, True, device))
                step()
                steps[w.label] = step
            except UnsupportedCallError as err:
                table[w.label]["note"] = "; ".join(err.reasons.values())
        for column, what, fns in (
            ("fwd_ms", "forward", forwards),
            ("fwd_bwd_ms", "fwd+bwd", steps),
        ):
            progress.doing(f"N={n} {what} x {repeats}")
            for label, ms in interleaved_median_ms(fns, repeats, device).items():
                table[label][column] = ms
            progress.advance(len(workloads))
        for w in workloads if memory else []:
            progress.doing(f"N={n} memory: {w.label}")
            if w.label in steps:  # not refused
                table[w.label]["train_peak_mb"] = (
                    peak_memory_mb(steps[w.label], device)
                    if on_cuda(device)
                    else isolated_peak_memory_mb(w, n)
                )
            progress.advance()
        rows += table.values()
    return add_ratios(pd.DataFrame(rows), baselines)


def add_ratios(table: pd.DataFrame, baselines: Sequence[str]) -> pd.DataFrame:
    """`table` (backend, N, fwd_ms, fwd_bwd_ms, train_peak_mb, note) with, for each baseline
    backend it holds, each row's ratio to the baseline's row at the same N: fwd_vs_, time_vs_
    (fwd+bwd) and mem_vs_ (training peak memory); `note` last."""
    table = table.copy()
    for base in baselines:
        ref = table[table.backend == base].set_index("N")
        if ref.empty:
            continue
        table[f"fwd_vs_{base}"] = table.fwd_ms / table.N.map(ref.fwd_ms)
        table[f"time_vs_{base}"] = table.fwd_bwd_ms / table.N.map(ref.fwd_bwd_ms)
        table[f"mem_vs_{base}"] = table.train_peak_mb / table.N.map(ref.train_peak_mb)
    return table[[c for c in table.columns if c != "note"] + ["note"]]
