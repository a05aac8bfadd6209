"""The gpu suite: its kernels, its rows (`gpu_rows`: the tables of `GPU_GROUPS`) and its
measuring within a time budget (`bench_gpu`, which ablations.bench.suites runs).

`CausalKernel` runs a causal softmax, linear or gated linear attention kernel on q, k and v cut
from one input, on a registered backend or on flash-linear-attention's Triton kernels ("fla"),
so that a `Workload` runs it as a module. A `Row` is a workload and the kernel backend serving
it; `unavailable` says why a row cannot run here (no CUDA, no triton, no fla, flex refused),
from the backend's own declared capabilities (attn_zoo/kernels/dispatch.py).

`measure_rows` makes one table with ablations.bench.measure's columns. At each N every row
runs once as a warm-up (compiling flex and the Triton kernels), then the timed repeats go round
the rows in turn; each repeat calls a row as many times as fill `TARGET_MS` (a GPU kernel of
microseconds is otherwise timed as launch and synchronisation overhead). The table has a time
budget: a row whose time at one N says that the next would not fit in the time left (`Spent`:
its calls times `GROWTH`, and a setup that came again) is skipped from the next N on, with a
note saying so. Every row not measured has a note: unavailable here, failed
(its error), or over the budget.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ablations.bench import GPU_BUDGET
from ablations.bench.masks import MaskedKernel
from ablations.bench.measure import (
    Workload,
    add_ratios,
    check_lengths,
    forward_backward,
    forward_only,
    interleaved_median_ms,
    on_cuda,
    peak_memory_mb,
    wall_ms,
)
from ablations.steps import Steps
from attn_zoo.kernels import relational  # noqa: F401 (registers the backends `unavailable` asks)
from attn_zoo.kernels.dispatch import Call, UnsupportedCallError, family
from attn_zoo.kernels.gla import gla_attention
from attn_zoo.kernels.linear import elu_feature_map, linear_attention
from attn_zoo.kernels.softmax import softmax_attention

PARTS = {"softmax": 3, "linear": 3, "gla": 4}  # q, k, v (gla: and the forget gates) in x
GROWTH = 4.0  # the most a row's time may grow from one N to the next (2 N: softmax's N^2)
TARGET_MS = 5.0  # a timed repeat calls a row for about this long (at least once, at most:)
MAX_CALLS = 100
CALIBRATION = 3  # calls timed to find how many fill TARGET_MS


class CausalKernel(nn.Module):
    """Causal `kernel` attention ("softmax", "linear" or "gla") on `backend`: a registered
    backend, or "fla", flash-linear-attention's chunk_linear_attn (on elu + 1 features, scale
    1, normalised: what attn_zoo/kernels/linear/chunked.py computes) or chunk_gla. Input x
    (1, N, d_model = parts heads head_dim) holds q, k and v, and for gla the forget gates
    (their logsigmoid: log_alpha); each backend reads them in its own layout, (B, H, N, d)
    views, fla (B, N, H, d). Output (1, heads, N, head_dim), fla (1, N, heads, head_dim)."""

    def __init__(self, d_model: int, heads: int, kernel: str, backend: str):
        super().__init__()
        if kernel not in PARTS:
            raise ValueError(f"kernel={kernel!r}: valid are {', '.join(PARTS)}")
        if d_model % (PARTS[kernel] * heads):
            raise ValueError(
                f"d_model={d_model}: {kernel} needs a multiple of {PARTS[kernel]} x heads "
                f"({PARTS[kernel]} x {heads})"
            )
        self.heads, self.kernel, self.backend = heads, kernel, backend

    def forward(self, x: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
        if not is_causal:
            raise ValueError("is_causal=False: CausalKernel computes causal attention only")
        fla = self.backend == "fla"
        layout = "b n h d" if fla else "b h n d"
        q, k, v, *gates = rearrange(
            x, f"b n (p h d) -> p {layout}", p=PARTS[self.kernel], h=self.heads
        )
        if self.kernel == "softmax":
            return softmax_attention(q, k, v, is_causal=True, backend=self.backend)
        if self.kernel == "linear" and fla:
            from fla.ops.linear_attn import chunk_linear_attn

            return chunk_linear_attn(elu_feature_map(q), elu_feature_map(k), v, scale=1.0)[0]
        if self.kernel == "linear":
            return linear_attention(q, k, v, is_causal=True, backend=self.backend)
        log_alpha = F.logsigmoid(gates[0])
        if fla:
            from fla.ops.gla import chunk_gla

            return chunk_gla(q, k, v, log_alpha)[0]
        return gla_attention(q, k, v, log_alpha, backend=self.backend)


def fla_missing() -> str | None:
    """None if flash-linear-attention's chunk_linear_attn and chunk_gla import, else why not."""
    try:
        import fla.ops.gla  # noqa: F401
        import fla.ops.linear_attn  # noqa: F401
    except Exception as err:  # not installed, or its Triton set-up failing on import
        return f"fla-core does not import (pip install 'attn_zoo[test]'): {err!r}"
    return None


@dataclass(frozen=True)
class Row:
    """A row of a gpu table: its workload and the kernel backend serving it, a (family,
    backend) of attn_zoo's kernel registry or ("fla", "fla")."""

    workload: Workload
    family: str
    backend: str

    @property
    def label(self) -> str:
        return self.workload.label


def unavailable(row: Row, device: str) -> str | None:
    """Why `row` cannot run on `device` in its dtype, or None: its backend's refusal of a plain
    call there (device, dtype, software: attn_zoo/kernels/dispatch.py `Backend.refusal`); fla:
    a CUDA device and the package importing."""
    kind = torch.device(device).type
    if row.family == "fla":
        if kind != "cuda":
            return f"no kernel for device {kind!r}: flash-linear-attention's are Triton, CUDA only"
        return fla_missing()
    call = Call(kind, getattr(torch, row.workload.dtype))
    return family(row.family).backends[row.backend].refusal(call)


def calls_per_repeat(fn: Callable[[], object], device: str) -> int:
    """How many fn() calls take about TARGET_MS (1 to MAX_CALLS), from the fastest of
    CALIBRATION timed calls."""
    ms = min(wall_ms(fn, device) for _ in range(CALIBRATION))
    return max(1, min(MAX_CALLS, round(TARGET_MS / ms))) if ms > 0 else MAX_CALLS


def repeated(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    def run():
        for _ in range(calls):
            fn()

    return run


def failure(err: Exception) -> str:
    """A row's note for an error its warm-up raised: a refusal's reasons, else the error (its
    message on one line, cut at 300 characters)."""
    if isinstance(err, UnsupportedCallError):
        return "; ".join(err.reasons.values())
    return f"failed: {type(err).__name__}: {' '.join(str(err).split())[:300]}"


@dataclass(frozen=True)
class Spent:
    """A row's seconds at the last N it was measured at, `n`: `calls` (its calls, warm-up and
    repeats: they grow with N) and `setup` (the rest of its warm-up: building, compiling);
    `again` when it was measured at an N before, so that this setup came again (a kernel
    compiled per shape, as flex) rather than once (a first compile, Triton's autotuning)."""

    n: int
    calls: float
    setup: float
    again: bool

    def next_n(self) -> float:
        """The seconds it may take at the next N (2 n): its calls times GROWTH, and its setup
        if that came again."""
        return GROWTH * self.calls + (self.setup if self.again else 0.0)


def over_budget(last: Spent | None, left: float) -> str | None:
    """Why a row is not measured at the next N, or None: no time `left` (seconds) in the
    table's budget, or what it took at its `last` N says it would not fit (`Spent.next_n`)."""
    if left <= 0:
        return "over the time budget: none left for this table"
    if last is not None and (expected := last.next_n()) > left:
        setup = f" and its setup's {last.setup:.3g} s" if last.again else ""
        return (
            f"over the time budget: {expected:.3g} s expected after N = {last.n} (its calls' "
            f"{last.calls:.3g} s times {GROWTH:g}{setup}), more than the {left:.3g} s this "
            "table had left"
        )
    return None


def measure_rows(
    rows: Sequence[Row],
    lengths: Sequence[int],
    repeats: int,
    device: str,
    baseline: str,
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
    memory: bool = True,
    progress: Steps | None = None,
) -> pd.DataFrame:
    """A row per (row, N): fwd_ms, fwd_bwd_ms, train_peak_mb (CUDA's allocator; NaN on CPU
    or with memory=False), ratios to `baseline` (ablations.bench.measure.add_ratios) and a
    note for each row not measured. The table may take `seconds` on `clock`: a row is skipped
    from the N where its time at the N before says it would not fit in the time left
    (`over_budget`); with none left, every row not yet measured. `progress` counts the
    measurements, rows x lengths x (forward, fwd+bwd), those skipped included."""
    check_lengths(lengths)
    progress = progress or Steps()
    progress.expect(len(rows) * len(lengths) * 2)
    until = clock() + seconds
    stopped = {row.label: why for row in rows if (why := unavailable(row, device))}
    spent: dict[str, Spent] = {}  # label -> what its last N took
    measured = []
    for n in lengths:
        for row in rows:
            if row.label not in stopped and (
                why := over_budget(spent.get(row.label), until - clock())
            ):
                stopped[row.label] = why
        table = {
            row.label: {"backend": row.label, "N": n, "fwd_ms": math.nan, "fwd_bwd_ms": math.nan,
                        "train_peak_mb": math.nan, "note": stopped.get(row.label, "")}
            for row in rows
        }  # fmt: skip
        forwards, steps, warm = {}, {}, {}
        for row in (row for row in rows if row.label not in stopped):
            progress.doing(f"N={n} warm-up: {row.label}")
            start = clock()
            try:  # a row's failure is one of the results: the other rows go on
                forward = forward_only(row.workload.make(n, False, device))
                forward()
                step = forward_backward(row.workload.make(n, True, device))
                step()
                calls = calls_per_repeat(forward, device), calls_per_repeat(step, device)
            except Exception as err:
                table[row.label]["note"] = failure(err)
                stopped[row.label] = f"not run: it failed at N = {n}"
                if on_cuda(device):
                    torch.cuda.empty_cache()
                continue
            forwards[row.label], steps[row.label] = (forward, calls[0]), (step, calls[1])
            warm[row.label] = clock() - start
        for column, what, fns in (
            ("fwd_ms", "forward", forwards),
            ("fwd_bwd_ms", "fwd+bwd", steps),
        ):
            progress.doing(f"N={n} {what} x {repeats}")
            loops = {label: repeated(fn, calls) for label, (fn, calls) in fns.items()}
            for label, ms in interleaved_median_ms(loops, repeats, device).items():
                table[label][column] = ms / fns[label][1]
            progress.advance(len(rows))
        for label, (step, step_calls) in steps.items():
            if memory and on_cuda(device):
                table[label]["train_peak_mb"] = peak_memory_mb(step, device)
            fwd_s, step_s = table[label]["fwd_ms"] / 1e3, table[label]["fwd_bwd_ms"] / 1e3
            untimed = (1 + CALIBRATION) * (fwd_s + step_s)  # the warm-up and calibration calls
            timed = repeats * (forwards[label][1] * fwd_s + step_calls * step_s)
            setup = max(0.0, warm[label] - untimed)
            spent[label] = Spent(n, untimed + timed, setup, label in spent)
        measured += table.values()
    return add_ratios(pd.DataFrame(measured), (baseline,))


GPU_DTYPES = ("bfloat16", "float32")
GPU_GROUPS = {  # table -> (its baseline row, what it compares)
    "softmax": ("sdpa", "the softmax kernel, causal, on sdpa (torch SDPA: FlashAttention in "
                "bfloat16), flex (FlexAttention, compiled) and chunked"),
    "relational": ("standard_sdpa", "a relational attention layer on the Triton kernel "
                   "(triton) against standard attention with the same heads on SDPA"),
    "masks": ("sdpa", "a causal window and documents of 3 windows as mask mods on flex "
              "(<mask>:flex; it builds the block mask at every call: attn_zoo/kernels/softmax/"
              "flex.py) and as dense boolean masks on sdpa (<mask>:sdpa, built before timing); "
              "sdpa: unmasked causal"),
    "linear": ("sdpa", "causal linear attention (elu + 1 features) on chunked against "
               "flash-linear-attention's chunk_linear_attn (fla); sdpa: causal softmax"),
    "gla": ("sdpa", "gated linear attention on chunked against flash-linear-attention's "
            "chunk_gla (fla); sdpa: causal softmax"),
}  # fmt: skip
RECOMPILES = 256  # torch.compile's recompile limit in the gpu suite (flex: once per shape)


def gpu_rows(
    group: str,
    dtype: str,
    heads: int = 8,
    head_dim: int = 64,
    d_model: int = 512,
    ra_heads: int = 4,
    window: int = 64,
) -> list[Row]:
    """The rows of the gpu suite's table `group` (GPU_GROUPS) in `dtype`, batch 1: kernels with
    `heads` heads of width `head_dim`, the relational layers as the relational suite's
    (d_model, `ra_heads` relational heads), masks of width `window` (ablations.bench.masks)."""
    if group not in GPU_GROUPS:
        raise ValueError(f"gpu group {group!r}: valid are {', '.join(GPU_GROUPS)}")
    if group == "relational":
        kwargs = dict(d_model=d_model, n_heads=ra_heads, total_n_heads=2 * ra_heads)
        return [
            Row(Workload("triton", "mechanism", "relational", kwargs, "triton", symbols=True,
                         dtype=dtype), "relational", "triton"),
            Row(Workload("standard_sdpa", "mechanism", "standard", kwargs, "sdpa", dtype=dtype),
                "softmax", "sdpa"),
        ]  # fmt: skip
    causal_kernel = f"{CausalKernel.__module__}.{CausalKernel.__name__}"

    def causal(label: str, kernel: str, backend: str) -> Row:
        kwargs = dict(d_model=PARTS[kernel] * heads * head_dim, heads=heads, kernel=kernel,
                      backend=backend)  # fmt: skip
        workload = Workload(label, "module", causal_kernel, kwargs, dtype=dtype)
        return Row(workload, "fla" if backend == "fla" else kernel, backend)

    sdpa = causal("sdpa", "softmax", "sdpa")
    if group == "softmax":
        return [sdpa, causal("flex", "softmax", "flex"), causal("chunked", "softmax", "chunked")]
    if group in ("linear", "gla"):
        return [
            sdpa,
            causal(f"{group}:chunked", group, "chunked"),
            causal(f"{group}:fla", group, "fla"),
        ]
    masked = f"{MaskedKernel.__module__}.{MaskedKernel.__name__}"
    shape = dict(d_model=3 * heads * head_dim, heads=heads, window=window)
    return [sdpa] + [
        Row(Workload(f"{mask}:{backend}", "module", masked,
                     {**shape, "mask": mask, "dense": backend == "sdpa", "backend": backend},
                     causal=False, dtype=dtype), "softmax", backend)
        for mask in ("window", "document")
        for backend in ("flex", "sdpa")
    ]  # fmt: skip


def bench_gpu(
    lengths: Sequence[int] = (1024, 2048, 4096, 8192, 16384),
    repeats: int = 5,
    device: str = "cuda",
    heads: int = 8,
    head_dim: int = 64,
    d_model: int = 512,
    ra_heads: int = 4,
    window: int = 64,
    budget: float = GPU_BUDGET,
    memory: bool = True,
    clock: Callable[[], float] = time.monotonic,
    progress: Steps | None = None,
) -> dict[tuple[str, str], pd.DataFrame]:
    """The gpu suite: a table per (group, dtype) of GPU_GROUPS x GPU_DTYPES, bfloat16 first
    (`gpu_rows`, measured by ablations.bench.gpu.measure_rows), in `budget` seconds on `clock`
    in all: each table may take the time left over the tables left. On CUDA torch.compile may
    compile flex RECOMPILES times (once per shape; importing torch._dynamo takes seconds, and
    flex does not run elsewhere)."""
    recompiles = contextlib.nullcontext()
    if on_cuda(device):
        import torch._dynamo

        recompiles = torch._dynamo.config.patch(recompile_limit=RECOMPILES)
    plan = [(group, dtype) for dtype in GPU_DTYPES for group in GPU_GROUPS]
    start, tables = clock(), {}
    with recompiles:
        for i, (group, dtype) in enumerate(plan):
            rows = gpu_rows(group, dtype, heads, head_dim, d_model, ra_heads, window)
            seconds = (budget - (clock() - start)) / (len(plan) - i)
            tables[group, dtype] = measure_rows(
                rows, lengths, repeats, device, GPU_GROUPS[group][0], seconds, clock, memory,
                progress,
            )  # fmt: skip
    return tables
