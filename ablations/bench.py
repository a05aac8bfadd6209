"""Speed and memory of attention backends, measured side by side in one run.

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
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch

from attn_zoo.kernels.dispatch import UnsupportedCallError, family
from attn_zoo.kernels.softmax import softmax_attention

if TYPE_CHECKING:
    from matplotlib.axes import Axes

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
    backend; "mechanism": attn_zoo.build(target, backend=backend, **kwargs) on (1, N, d_model)
    inputs; "module": the class at dotted path `target` built with kwargs. Mechanisms and
    modules get random symbols too when `symbols`; a tuple output is read at [0].
    """

    label: str
    source: str
    target: str
    kwargs: dict = field(default_factory=dict)
    backend: str = "auto"
    causal: bool = True
    symbols: bool = False

    def make(self, n: int, grad: bool, device: str = "cpu") -> Run:
        torch.manual_seed(0)
        if self.source == "softmax":
            shape = self.kwargs
            dtype = getattr(torch, shape.get("dtype", "float32"))
            q, k, v = (
                torch.randn(shape["batch"], shape["heads"], n, shape["head_dim"], dtype=dtype,
                            device=device, requires_grad=grad)
                for _ in range(3)
            )  # fmt: skip
            return lambda: softmax_attention(q, k, v, is_causal=self.causal, backend=self.target)
        module = self.module().to(device).requires_grad_(grad)
        d_model = self.kwargs["d_model"]
        x = torch.randn(1, n, d_model, device=device, requires_grad=grad)
        args = (x, torch.randn(1, n, d_model, device=device)) if self.symbols else (x,)

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


def forward_backward(run: Run) -> Callable[[], None]:
    def step():
        out = run()
        out.backward(torch.ones_like(out))

    return step


def wall_ms(fn: Callable[[], object], device: str) -> float:
    """Wall time of one fn() call in milliseconds (on CUDA, synchronised)."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
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


def _no_grad(run: Run) -> Callable[[], None]:
    def forward():
        with torch.no_grad():
            run()

    return forward


def _status_kib(name: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(name))


def peak_memory_mb(fn: Callable[[], object], device: str = "cpu") -> float:
    """Peak memory fn() adds above what was in use before it, in MiB (NaN if unmeasurable).

    CPU: rise of this process's peak resident set; call it in a fresh process (see
    `isolated_peak_memory_mb`) for numbers independent of earlier work.
    """
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    try:
        before = _status_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set (VmHWM) to the current one
        fn()
        return (_status_kib("VmHWM") - before) / 1024
    except (OSError, StopIteration):
        return float("nan")


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
        [sys.executable, "-c", "from ablations.bench import _memory_child; _memory_child()"],
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
) -> pd.DataFrame:
    """A row per (workload, N): fwd_ms, fwd_bwd_ms, train_peak_mb, ratios to each baseline
    label measured in this run (fwd_vs_, time_vs_ for fwd+bwd, mem_vs_ for training peak
    memory; memory=False skips measuring it), and a note when a workload could not run.

    At each N every workload runs once as a warm-up, then the timed repeats go round the
    workloads in turn (`interleaved_median_ms`)."""
    rows = []
    for n in lengths:
        table = {
            w.label: {"backend": w.label, "N": n, "fwd_ms": float("nan"),
                      "fwd_bwd_ms": float("nan"), "train_peak_mb": float("nan"), "note": ""}
            for w in workloads
        }  # fmt: skip
        forwards, steps = {}, {}
        for w in workloads:
            try:  # the warm-up runs, which also find the calls a backend cannot serve
                forward = _no_grad(w.make(n, False, device))
                forward()
                forwards[w.label] = forward
                step = forward_backward(w.make(n, True, device))
                step()
                steps[w.label] = step
            except UnsupportedCallError as err:
                table[w.label]["note"] = "; ".join(err.reasons.values())
        for column, fns in (("fwd_ms", forwards), ("fwd_bwd_ms", steps)):
            for label, ms in interleaved_median_ms(fns, repeats, device).items():
                table[label][column] = ms
        for w in workloads:
            if not memory or w.label not in steps:
                continue
            if device == "cuda":
                table[w.label]["train_peak_mb"] = peak_memory_mb(steps[w.label], device)
            else:
                table[w.label]["train_peak_mb"] = isolated_peak_memory_mb(w, n)
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


def bench_softmax(
    lengths: Sequence[int] = (256, 512, 1024, 2048, 4096),
    backends: Sequence[str] | None = None,
    repeats: int = 5,
    device: str = "cpu",
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    causal: bool = True,
    dtype: str = "float32",
    memory: bool = True,
) -> pd.DataFrame:
    """Every softmax backend usable on `device` (or `backends`), over `lengths`."""
    if backends is None:
        fam = family("softmax")
        backends = [b for b in fam.backends if fam.status(b, device)[0]]
    shape = dict(batch=batch, heads=heads, head_dim=head_dim, dtype=dtype)
    workloads = [Workload(b, "softmax", b, shape, causal=causal) for b in backends]
    return measure(workloads, lengths, repeats, device, memory=memory)


def reference_package() -> str | None:
    """None if the `dual_attention` reference package imports, else why not."""
    try:
        import dual_attention  # noqa: F401
    except ImportError as err:
        return f"dual-attention is not installed (pip install 'attn_zoo[test]'): {err}"
    return None


REFERENCE_CLASSES = {
    "relational": "dual_attention.relational_attention.RelationalAttention",
    "dual": "dual_attention.dual_attention.DualAttention",
}


def relational_workloads(
    suite: str, d_model: int, heads: int, causal: bool, backends: Sequence[str] | None = None
) -> list[Workload]:
    """The `relational` or `dual` suite: our layer on each of `backends` (default: auto and
    every registered backend), the reference package's module and a standard attention layer
    with the same heads on SDPA.

    relational: `heads` relational heads of width d_model / (2 heads), the relational half of
    dual attention with `heads` + `heads` heads; dual: that dual attention.
    """
    from attn_zoo.mechanisms.registry import list_backends

    if suite == "relational":
        kwargs = dict(d_model=d_model, n_heads=heads, total_n_heads=2 * heads)
        standard = dict(kwargs)
        reference = dict(kwargs)
    else:
        kwargs = dict(d_model=d_model, n_heads_sa=heads, n_heads_ra=heads)
        standard = dict(d_model=d_model, n_heads=2 * heads)
        reference = dict(kwargs, dropout=0.0)
    registered = ["auto", *list_backends(suite)]  # auto: the best backend for each branch
    if backends is None:
        backends = registered
    elif unknown := [b for b in backends if b not in registered]:
        raise ValueError(f"{suite} backends {unknown}: valid are {registered}")
    ours = [Workload(b, "mechanism", suite, kwargs, b, causal, True) for b in backends]
    if reference_package() is None:
        ours.append(
            Workload(
                "reference",
                "module",
                REFERENCE_CLASSES[suite],
                reference,
                causal=causal,
                symbols=True,
            )
        )
    ours.append(Workload("standard_sdpa", "mechanism", "standard", standard, "sdpa", causal))
    return ours


def bench_relational(
    suite: str = "relational",
    lengths: Sequence[int] = (512, 1024, 2048, 4096),
    repeats: int = 3,
    d_model: int = 512,
    heads: int = 4,
    causal: bool = True,
    device: str = "cpu",
    memory: bool = True,
    backends: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Our relational or dual attention on `backends` (default: every one) beside the
    reference package and a standard SDPA layer, ratios to both (time_vs_reference,
    time_vs_standard_sdpa, ...)."""
    workloads = relational_workloads(suite, d_model, heads, causal, backends)
    baselines = ("reference", "standard_sdpa")
    return measure(workloads, lengths, repeats, device, baselines, memory)


SEQUENCE_MECHANISMS = {  # name -> kwargs beside d_model, for the `mechanisms` suite
    "standard": lambda heads: dict(n_heads=heads),
    "linear": lambda heads: dict(n_heads=heads),
    "additive": lambda heads: dict(n_heads=heads),
    "axial": lambda heads: dict(n_heads=heads, n_axes=1),
}


def bench_mechanisms(
    lengths: Sequence[int] = (512, 1024, 2048, 4096),
    repeats: int = 3,
    d_model: int = 512,
    heads: int = 8,
    causal: bool = True,
    device: str = "cpu",
    memory: bool = True,
) -> pd.DataFrame:
    """Sequence mechanisms other than the relational family, each on every backend it has,
    as layers on (1, N, d_model); ratios to standard attention on SDPA (standard:sdpa)."""
    from attn_zoo.mechanisms.registry import list_backends

    workloads = [
        Workload(
            f"{name}:{backend}",
            "mechanism",
            name,
            dict(d_model=d_model, **kwargs(heads)),
            backend,
            causal,
        )
        for name, kwargs in SEQUENCE_MECHANISMS.items()
        for backend in list_backends(name)
        if backend not in ("flex", "xformers")  # no CPU backward / no CPU kernels
    ]
    return measure(workloads, lengths, repeats, device, ("standard:sdpa",), memory)


REPORT_BASELINES = ("sdpa", "standard_sdpa", "standard:sdpa", "reference")  # whichever a suite has
LINESTYLES = ("-", "--", ":", "-.")  # one per baseline on a ratio plot
REPORT_NOTES = (
    "Time: median wall-clock milliseconds of one forward pass (no gradients) and of one "
    "forward+backward pass, after a warm-up, the repeats taken in turns over the backends of a "
    "suite at each N. Peak MiB: the memory one forward+backward adds "
    "above what was in use before it (CPU: the rise of the peak resident set, in a fresh "
    "process; CUDA: torch's allocator peak). Ratios (x vs b): a row's value divided by that of "
    "backend b at the same N, in the same run on the same machine; below 1 is faster or "
    "smaller. sdpa, standard_sdpa and standard:sdpa are torch's scaled_dot_product_attention "
    "(the kernel, or a standard attention layer on it); reference is the dual-attention "
    "package. A dash: not measured, or the backend refused the call (notes under the table). "
    "Plots are log-log; each suite's numbers are in bench_<suite>.csv."
)


def _number(value: float) -> str:
    """A table cell: '-' for NaN, else three significant digits (whole numbers from 100)."""
    if pd.isna(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _suite_table(table: pd.DataFrame, baselines: list[str], memory: bool) -> pd.DataFrame:
    """A suite's table as shown, by header: per (N, backend), times, peak memory and ratios."""
    columns = {"fwd_ms": "fwd ms", "fwd_bwd_ms": "fwd+bwd ms", "train_peak_mb": "peak MiB"}
    for base in baselines:
        columns[f"fwd_vs_{base}"] = f"fwd vs {base}"
        columns[f"time_vs_{base}"] = f"fwd+bwd vs {base}"
        columns[f"mem_vs_{base}"] = f"memory vs {base}"
    if not memory:
        columns = {c: h for c, h in columns.items() if not c.startswith(("train_peak", "mem_vs"))}
    shown = {"N": table.N.astype(str), "backend": table.backend.astype(str)}
    shown |= {header: table[column].map(_number) for column, header in columns.items()}
    return pd.DataFrame(shown).reset_index(drop=True)


def _notes(table: pd.DataFrame) -> list[str]:
    """Why backends refused calls: 'backend at N = n, ...: note', one item per (backend, note)."""
    noted = table[table.note.fillna("") != ""]
    return [
        f"{backend} at N = {', '.join(map(str, group.N))}: {note}"
        for (backend, note), group in noted.groupby(["backend", "note"], sort=False)
    ]


def _plot_lines(
    ax: Axes, table: pd.DataFrame, lines: dict[str, tuple[str, str]], colours: dict
) -> None:
    """Each backend's columns `lines` ({column: (linestyle, legend)}) against N on log-log
    axes, positive values only; a colour per backend, a line style per column."""
    drawn = []
    for backend, rows in table.groupby("backend", sort=False):
        for column, (style, _) in lines.items():
            values = rows.set_index("N")[column]
            values = values[values > 0]
            if len(values):
                ax.plot(values.index, values, linestyle=style, marker="o", color=colours[backend])
                drawn.append(backend)
    for backend in dict.fromkeys(drawn):  # legend entries: backends, then line styles
        ax.plot([], [], color=colours[backend], label=backend)
    if len(lines) > 1:
        for style, legend in lines.values():
            ax.plot([], [], linestyle=style, color="grey", label=legend)
    lengths = sorted(table.N.unique())
    ax.set(xscale="log", yscale="log", xlabel="sequence length N")
    ax.set_xticks(lengths, labels=[str(n) for n in lengths])
    ax.set_xticks([], minor=True)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))


def _report_folder(out_dir: str | Path, command: str) -> tuple[Path, list[str]]:
    """The report folder (created) and the facts every benchmark report opens with."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    facts = [
        f"Machine: {machine()}",
        f"Generated: {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"Command: {command}",
    ]
    return folder, facts


def write_bench_report(
    tables: dict[str, pd.DataFrame],
    out_dir: str | Path,
    title: str,
    settings: dict[str, str],
    command: str,
) -> Path:
    """Write a report of bench tables measured on this machine ({suite: table of `measure`})
    into `out_dir` (created if missing): report.md, a self-contained index.html, and per suite
    bench_<suite>.csv and log-log plots against N: time_<suite>.png (forward and
    forward+backward), memory_<suite>.png (training peak, when measured) and ratio_<suite>.png
    (forward+backward time over the suite's SDPA and reference baselines). `settings` names
    each suite's settings and `command` the command line that writes the report again.
    Returns `out_dir`."""
    # matplotlib and jinja2 are imported here only: the process that measures memory imports
    # this module
    from ablations.report_pages import (
        Bullets,
        Image,
        Page,
        Paragraph,
        Section,
        Table,
        file_name,
        label_colours,
        new_figure,
        write_pages,
    )

    folder, facts = _report_folder(out_dir, command)
    page = Page(title, facts, REPORT_NOTES)
    for suite, table in tables.items():
        table.to_csv(folder / f"bench_{suite}.csv", index=False)
        baselines = [base for base in REPORT_BASELINES if f"time_vs_{base}" in table]
        memory = bool(table.train_peak_mb.notna().any())
        section = Section(f"Suite: {suite}")
        section.parts.extend(
            [Paragraph(settings[suite]), Table(_suite_table(table, baselines, memory))]
        )
        if notes := _notes(table):
            section.parts.append(Bullets(notes))
        page.sections.append(section)
        backends = set(table.backend)
        colours = label_colours(backends, "tab10" if len(backends) <= 10 else "tab20")
        plots = {
            "time": ({"fwd_bwd_ms": ("-", "fwd+bwd"), "fwd_ms": ("--", "fwd")}, "time (ms)"),
            "memory": ({"train_peak_mb": ("-", "fwd+bwd")}, "training peak memory (MiB)"),
            "ratio": (
                {f"time_vs_{b}": (LINESTYLES[i], f"vs {b}") for i, b in enumerate(baselines)},
                "fwd+bwd time ratio to the baseline",
            ),
        }
        for kind, (lines, ylabel) in plots.items():
            if not lines or not (table[list(lines)] > 0).to_numpy().any():
                continue
            figure, ax = new_figure()
            _plot_lines(ax, table, lines, colours)
            if kind == "ratio":
                ax.axhline(1, color="grey", linewidth=0.8)
            ax.set(ylabel=ylabel, title=f"{suite}: {ylabel}")
            name = file_name(kind, suite)
            figure.savefig(folder / name, dpi=100)
            section.parts.append(Image(name, f"{suite}: {ylabel} against N"))
    write_pages(page, folder)
    return folder


# --- generation: tokens per second of LanguageModel.generate, cached vs uncached -------------

GENERATION_MODELS = {  # mechanism -> LanguageModel settings beside the sizes
    "standard": lambda heads: dict(attention="standard", attention_kwargs=dict(n_heads=heads)),
    "relational": lambda heads: dict(
        attention="relational",
        attention_kwargs=dict(n_heads=heads),
        symbol_retrieval="symbolic_attention",
        symbol_retrieval_kwargs=dict(n_symbols=32, n_heads=heads),
    ),
}
GENERATION_NOTES = (
    "Tokens per second of LanguageModel.generate (greedy, batch 1) from a random prompt to N "
    "tokens in all: new tokens / wall-clock seconds of the whole call, prefill included, the "
    "median of the repeats, each repeat running every (mechanism, cached or not) once in turn "
    "after a short warm-up. cached: a KV cache (relational: keys, relation keys and symbol "
    "values), the prompt run once, then one token a step; uncached: the whole context "
    "recomputed for every token. speedup: cached over uncached tokens per second of the same "
    "mechanism at the same N, in the same run on the same machine. The model is randomly "
    "initialised (speed does not depend on the weights). Plots are log-log; the numbers are in "
    "bench_generation.csv."
)


def bench_generation(
    lengths: Sequence[int] = (64, 256, 512),
    repeats: int = 5,
    d_model: int = 128,
    n_layers: int = 4,
    heads: int = 4,
    prompt: int = 16,
    vocab_size: int = 256,
    pos_enc: str = "rope",
    mechanisms: Sequence[str] = ("standard", "relational"),
    device: str = "cpu",
    threads: int | None = 1,
) -> pd.DataFrame:
    """A row per (mechanism:cached|uncached, N): tokens_per_s and ms_per_token of generating
    N - prompt tokens after a `prompt`-token prompt (max_block_size = the largest N), and
    speedup (cached over uncached tokens per second at the same N). `threads`: torch threads
    while measuring (default 1: a batch-1 decode step is too small to share, and a second
    thread on a busy machine slows it by up to 10x); None keeps the current setting."""
    from attn_zoo.models import LanguageModel

    if unknown := [m for m in mechanisms if m not in GENERATION_MODELS]:
        raise ValueError(f"generation mechanisms {unknown}: valid are {list(GENERATION_MODELS)}")
    if min(lengths) <= prompt:
        raise ValueError(f"lengths {list(lengths)} must all exceed the prompt ({prompt} tokens)")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        models = {}
        for name in mechanisms:
            torch.manual_seed(0)
            models[name] = LanguageModel(
                vocab_size, d_model, n_layers, max_block_size=max(lengths), pos_enc=pos_enc,
                **GENERATION_MODELS[name](heads),
            ).to(device).eval()  # fmt: skip
        idx = torch.randint(0, vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
        idx = idx.to(device)
        rows = []
        for n in lengths:
            fns = {}
            for name, model in models.items():
                for mode in ("cached", "uncached"):
                    use_cache = mode == "cached"

                    def run(model=model, use_cache=use_cache, new=n - prompt):
                        return model.generate(idx, new, temperature=0, use_cache=use_cache)

                    model.generate(idx, min(8, n - prompt), temperature=0, use_cache=use_cache)
                    fns[f"{name}:{mode}"] = run
            times = interleaved_median_ms(fns, repeats, device)
            for label, ms in times.items():
                new, uncached = n - prompt, times[label.split(":")[0] + ":uncached"]
                rows.append(
                    {"backend": label, "N": n, "prompt": prompt, "new_tokens": new,
                     "tokens_per_s": new / (ms / 1e3), "ms_per_token": ms / new,
                     "speedup": uncached / ms}
                )  # fmt: skip
    finally:
        torch.set_num_threads(before)
    return pd.DataFrame(rows)


def write_generation_report(
    table: pd.DataFrame, out_dir: str | Path, settings: str, command: str
) -> Path:
    """Write the generation suite's report into `out_dir` as `write_bench_report` writes the
    others: report.md, index.html, bench_generation.csv, and log-log plots against N of
    tokens per second (tokens_generation.png) and of the cached speedup
    (speedup_generation.png). Returns `out_dir`."""
    from ablations.report_pages import (
        Image,
        Page,
        Paragraph,
        Section,
        Table,
        file_name,
        label_colours,
        new_figure,
        write_pages,
    )

    folder, facts = _report_folder(out_dir, command)
    page = Page("Generation benchmark: cached vs uncached decoding", facts, GENERATION_NOTES)
    table.to_csv(folder / "bench_generation.csv", index=False)
    columns = {"tokens_per_s": "tokens/s", "ms_per_token": "ms/token", "speedup": "speedup"}
    shown = {
        "N": table.N.astype(str),
        "backend": table.backend.astype(str),
        "new tokens": table.new_tokens.astype(str),
    }
    shown |= {header: table[column].map(_number) for column, header in columns.items()}
    section = Section("Suite: generation")
    section.parts.extend([Paragraph(settings), Table(pd.DataFrame(shown))])
    page.sections.append(section)
    colours = label_colours(set(table.backend))
    plots = {
        "tokens": (table, "tokens_per_s", "tokens per second"),
        "speedup": (
            table[table.backend.str.endswith(":cached")],
            "speedup",
            "cached speedup over uncached",
        ),
    }
    for kind, (rows, column, ylabel) in plots.items():
        figure, ax = new_figure()
        _plot_lines(ax, rows, {column: ("-", ylabel)}, colours)
        if kind == "speedup":
            ax.axhline(1, color="grey", linewidth=0.8)
        ax.set(ylabel=ylabel, title=f"generation: {ylabel}", xlabel="total length N")
        name = file_name(kind, "generation")
        figure.savefig(folder / name, dpi=100)
        section.parts.append(Image(name, f"generation: {ylabel} against N"))
    write_pages(page, folder)
    return folder
