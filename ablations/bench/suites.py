"""The benchmark suites and what ``attn-zoo bench`` runs.

- softmax: every softmax kernel backend usable here on (batch, heads, N, head_dim) tensors;
- relational, dual: our layer on each backend beside the dual-attention package's layer and a
  standard attention layer with the same heads on SDPA;
- mechanisms: the other sequence mechanisms on each backend they have, beside standard
  attention on SDPA;
- generation: tokens per second of `LanguageModel.generate`, cached vs uncached;
- window: a causal sliding window as a mask mod on chunked (O(N w)) against the same window as
  a dense mask;
- masks: local masks and a combination as mask mods on chunked (its block mask skipping the
  empty tiles: O(N visible)) against the same masks as dense masks on sdpa (ablations.bench.
  masks), with the growth per doubling of N and the cost over the dense cost of the tiles kept;
- gpu: FlashAttention (torch SDPA) against flex and chunked, the relational Triton layer,
  window and document masks on flex, linear and gated linear attention against
  flash-linear-attention's kernels, in bfloat16 and float32, within a time budget; the rows a
  machine cannot run are noted with why (`gpu_rows`, ablations.bench.gpu).

`BenchRun` holds one run's settings (the CLI's options); `run_bench` measures its suites,
prints each table and writes the CSVs and the report it asks for (ablations.bench.report).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch

from ablations.bench import GPU_BUDGET, SUITES
from ablations.bench.gpu import GPU_GROUPS, TARGET_MS, bench_gpu
from ablations.bench.masks import MASKS, MaskedKernel, kept_tiles
from ablations.bench.measure import (
    Workload,
    check_lengths,
    interleaved_median_ms,
    machine,
    measure,
)
from ablations.grid.devices import device_problem
from ablations.steps import Steps, make_steps
from attn_zoo.kernels.dispatch import family
from attn_zoo.kernels.softmax.chunked import BLOCK
from attn_zoo.kernels.softmax.sdpa import BLOCK as SDPA_BLOCK

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_LENGTHS = {
    "softmax": [256, 512, 1024, 2048, 4096],
    "relational": [512, 1024, 2048, 4096],  # and every other layer suite
    "generation": [64, 256, 512],  # total tokens (prompt + generated)
    "window": [512, 1024, 2048, 4096, 8192],
    "masks": [1024, 2048, 4096, 8192, 16384],
    "gpu": [1024, 2048, 4096, 8192, 16384],
}
# The generation suite's model: LanguageModel sizes, and the prompt length
GENERATION_SIZES = {"d_model": 128, "n_layers": 4, "heads": 4, "prompt": 16}


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
    progress: Steps | None = None,
) -> pd.DataFrame:
    """Every softmax backend usable on `device` (or `backends`), over `lengths`; `progress`
    counts the measurements (see `measure`)."""
    if backends is None:
        fam = family("softmax")
        backends = [b for b in fam.backends if fam.status(b, torch.device(device).type)[0]]
    shape = dict(batch=batch, heads=heads, head_dim=head_dim)
    workloads = [Workload(b, "softmax", b, shape, causal=causal, dtype=dtype) for b in backends]
    return measure(workloads, lengths, repeats, device, memory=memory, progress=progress)


def bench_window(
    lengths: Sequence[int] = (512, 1024, 2048, 4096, 8192),
    window: int = 64,
    repeats: int = 5,
    device: str = "cpu",
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    memory: bool = True,
    progress: Steps | None = None,
) -> pd.DataFrame:
    """Causal sliding-window attention of `window` keys: chunked with the window as a mask mod
    (key tiles outside it skipped: O(N w) time and memory) against chunked, naive and sdpa
    given the same window as a dense (N, N) boolean mask; ratios to chunked:mask."""
    shape = dict(batch=batch, heads=heads, head_dim=head_dim, window=window)
    runs = [("chunked", "mod"), ("naive", "mod"), ("chunked", "mask"), ("naive", "mask"),
            ("sdpa", "mask")]  # fmt: skip
    workloads = [
        Workload(f"{backend}:{how}", "softmax", backend, {**shape, "window_as": how})
        for backend, how in runs
    ]
    baselines = ("chunked:mask", "sdpa:mask")
    return measure(workloads, lengths, repeats, device, baselines, memory, progress)


def bench_masks(
    lengths: Sequence[int] = (1024, 2048, 4096, 8192, 16384),
    window: int = 64,
    repeats: int = 5,
    device: str = "cpu",
    heads: int = 8,
    head_dim: int = 64,
    memory: bool = True,
    progress: Steps | None = None,
) -> pd.DataFrame:
    """Each of ablations.bench.masks.MASKS (width `window`) as a mask mod on sdpa
    (<mask>:sdpa: one SDPA call per query tile over the key tiles its block mask keeps) and on
    chunked (<mask>:chunked: its tiles, empty ones skipped), and as a dense boolean mask on
    sdpa (<mask>:dense), batch 1, `heads` heads of width `head_dim`, float32, all in one run
    (repeats interleaved), with per row: fwd_vs_dense, time_vs_dense (fwd, fwd+bwd over the
    same mask's dense row at that N); kept_tiles (the fraction of the (BLOCK x BLOCK) tiles
    the mask leaves non-empty, the row's backend's BLOCK; dense: sdpa's) and, for the mods,
    time_vs_kept_dense (fwd+bwd over the dense time times kept_tiles: the dense cost of the
    tiles computed); growth (fwd+bwd over the same row's at N / 2, where measured: 2 is
    linear)."""
    kernel = f"{MaskedKernel.__module__}.{MaskedKernel.__name__}"
    shape = dict(d_model=3 * heads * head_dim, heads=heads, window=window)
    workloads = [
        Workload(f"{mask}:{how}", "module", kernel,
                 {**shape, "mask": mask, "dense": how == "dense",
                  "backend": "sdpa" if how == "dense" else how},
                 causal=False)
        for mask in MASKS
        for how in ("sdpa", "chunked", "dense")
    ]  # fmt: skip
    table = measure(workloads, lengths, repeats, device, (), memory, progress)
    mask = table.backend.str.split(":").str[0]
    dense = table[table.backend.str.endswith(":dense")].assign(mask=mask).set_index(["mask", "N"])
    keys = pd.MultiIndex.from_arrays([mask, table.N])
    table["fwd_vs_dense"] = table.fwd_ms.to_numpy() / dense.fwd_ms.reindex(keys).to_numpy()
    table["time_vs_dense"] = table.fwd_bwd_ms.to_numpy() / dense.fwd_bwd_ms.reindex(keys).to_numpy()
    blocks = table.backend.str.endswith(":chunked").map({True: BLOCK, False: SDPA_BLOCK})
    table["kept_tiles"] = [
        kept_tiles(m, n, window, block) for m, n, block in zip(mask, table.N, blocks, strict=True)
    ]
    mods = ~table.backend.str.endswith(":dense")
    table["time_vs_kept_dense"] = (table.time_vs_dense / table.kept_tiles).where(mods)
    halves = table.set_index(["backend", "N"]).fwd_bwd_ms
    half = pd.MultiIndex.from_arrays([table.backend, table.N // 2])
    table["growth"] = table.fwd_bwd_ms.to_numpy() / halves.reindex(half).to_numpy()
    return table[[c for c in table.columns if c != "note"] + ["note"]]


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
    progress: Steps | None = None,
) -> pd.DataFrame:
    """Our relational or dual attention on `backends` (default: every one) beside the
    reference package and a standard SDPA layer, ratios to both (time_vs_reference,
    time_vs_standard_sdpa, ...)."""
    workloads = relational_workloads(suite, d_model, heads, causal, backends)
    baselines = ("reference", "standard_sdpa")
    return measure(workloads, lengths, repeats, device, baselines, memory, progress)


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
    progress: Steps | None = None,
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
        if backend not in ("flex", "xformers")  # GPU backends: refused on CPU
    ]
    return measure(workloads, lengths, repeats, device, ("standard:sdpa",), memory, progress)


GENERATION_MODELS = {  # mechanism -> LanguageModel settings beside the sizes
    "standard": lambda heads: dict(attention="standard", attention_kwargs=dict(n_heads=heads)),
    "relational": lambda heads: dict(
        attention="relational",
        attention_kwargs=dict(n_heads=heads),
        symbol_retrieval="symbolic_attention",
        symbol_retrieval_kwargs=dict(n_symbols=32, n_heads=heads),
    ),
}


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
    progress: Steps | None = None,
) -> pd.DataFrame:
    """A row per (mechanism:cached|uncached, N): tokens_per_s and ms_per_token of generating
    N - prompt tokens after a `prompt`-token prompt (max_block_size = the largest N), and
    speedup (cached over uncached tokens per second at the same N). `threads`: torch threads
    while measuring (default 1: a batch-1 decode step is too small to share, and a second
    thread on a busy machine slows it by up to 10x); None keeps the current setting.
    `progress` (ablations.steps) counts the measurements: lengths x mechanisms x (cached,
    uncached), told between the timed rounds."""
    from attn_zoo.models import LanguageModel

    if unknown := [m for m in mechanisms if m not in GENERATION_MODELS]:
        raise ValueError(f"generation mechanisms {unknown}: valid are {list(GENERATION_MODELS)}")
    check_lengths(lengths)
    if min(lengths) <= prompt:
        raise ValueError(f"lengths {list(lengths)} must all exceed the prompt ({prompt} tokens)")
    progress = progress or Steps()
    progress.expect(len(lengths) * len(mechanisms) * 2)
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
            progress.doing(f"N={n} warm-up")
            fns = {}
            for name, model in models.items():
                for mode in ("cached", "uncached"):
                    use_cache = mode == "cached"

                    def run(model=model, use_cache=use_cache, new=n - prompt):
                        return model.generate(idx, new, temperature=0, use_cache=use_cache)

                    model.generate(idx, min(8, n - prompt), temperature=0, use_cache=use_cache)
                    fns[f"{name}:{mode}"] = run
            progress.doing(f"N={n} generating x {repeats}")
            times = interleaved_median_ms(fns, repeats, device)
            progress.advance(len(fns))
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


@dataclass
class BenchRun:
    """One ``attn-zoo bench`` run: which suites, at which lengths and settings, and where its
    CSVs (`csv_dir`) and report (`report`) go. None: the suite's default."""

    suite: list[str] = field(default_factory=lambda: list(SUITES))
    lengths: list[int] | None = None
    repeats: int = 5
    device: str = "cpu"
    no_causal: bool = False
    also_non_causal: bool = False
    no_memory: bool = False
    csv_dir: str | None = None
    report: str | None = None
    backends: list[str] | None = None  # softmax suite
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    dtype: str = "float32"
    d_model: int = 512  # relational, dual and mechanisms suites
    ra_heads: int = 4
    ra_backends: list[str] | None = None
    window: int = 64  # window suite
    budget: float = GPU_BUDGET  # gpu suite: seconds for all its tables

    def check(self) -> None:
        """ValueError naming the option, its value and what is valid, for a setting this run
        cannot measure or write: checked before anything is measured. Creates the --csv-dir
        and --report folders (to check that files can be written there)."""
        if "generation" in self.suite and len(self.suite) > 1:
            raise ValueError("--suite generation runs on its own (its report differs)")
        if "gpu" in self.suite and len(self.suite) > 1:
            raise ValueError("--suite gpu runs on its own (its time budget is the whole run's)")
        if "gpu" in self.suite and (self.no_causal or self.also_non_causal):
            raise ValueError(
                "--suite gpu times causal attention (its masks hold their own causality): "
                "drop --no-causal and --also-non-causal"
            )
        if not self.budget > 0:
            raise ValueError(f"--budget {self.budget}: give the gpu suite's seconds, > 0")
        if not re.fullmatch(r"cpu|cuda|cuda:\d+", self.device):
            raise ValueError(f"--device {self.device!r}: the bench runs on cpu, cuda or cuda:N")
        if problem := device_problem(self.device):
            raise ValueError(f"--device {self.device}: {problem} here")
        if self.lengths is not None:
            check_lengths(self.lengths, "--lengths")
        from ablations.report.pages import writable_folder

        for option, folder in (("--csv-dir", self.csv_dir), ("--report", self.report)):
            if folder is not None:
                writable_folder(option, folder)

    def suite_lengths(self, suite: str) -> list[int]:
        return self.lengths or DEFAULT_LENGTHS.get(suite, DEFAULT_LENGTHS["relational"])

    def title(self, suite: str, causal: bool) -> str:
        """A suite's settings in one line, as its report and printout state them."""
        how = "causal" if causal else "non-causal"
        if suite == "softmax":
            return (
                f"softmax attention kernel: batch {self.batch}, {self.heads} heads of width "
                f"{self.head_dim}, {how}, {self.dtype}"
            )
        if suite == "masks":
            return (
                f"local masks of width {self.window} on the softmax kernel, non-causal calls "
                f"(the masks hold any causality): batch 1, {self.heads} heads of width "
                f"{self.head_dim}, float32; as a mask mod on sdpa (:sdpa, per query tile over "
                "its kept key tiles) or chunked (:chunked), or as a dense (N, N) boolean mask "
                "on sdpa (:dense, built before timing)"
            )
        if suite == "window":
            return (
                f"causal sliding window of {self.window} keys on the softmax kernel: batch "
                f"{self.batch}, {self.heads} heads of width {self.head_dim}, float32; as a mask "
                "mod (:mod) or as a dense (N, N) boolean mask (:mask, built before timing)"
            )
        if suite == "mechanisms":
            return (
                f"attention layers: d_model {self.d_model}, {self.heads} heads, batch 1, {how}, "
                "float32; ratios to standard attention on SDPA"
            )
        if suite == "generation":
            g = GENERATION_SIZES
            return (
                f"LanguageModel: d_model {g['d_model']}, {g['n_layers']} layers, {g['heads']} "
                f"heads, vocabulary 256, RoPE, float32 on {self.device}, 1 torch thread; "
                f"relational: symbolic_attention symbols (32); prompt {g['prompt']} tokens, greedy"
            )
        heads = self.ra_heads if suite == "relational" else f"{self.ra_heads}+{self.ra_heads}"
        return (
            f"{suite} attention layer: d_model {self.d_model}, {heads} heads, batch 1, {how}, "
            "float32; standard_sdpa: standard attention with the same heads on SDPA"
        )

    def gpu_title(self, group: str, dtype: str) -> str:
        """A gpu suite table's settings in one line, as its report and printout state them."""
        baseline, rows = GPU_GROUPS[group]
        sizes = (
            f"d_model {self.d_model}, {self.ra_heads} relational heads"
            if group == "relational"
            else f"{self.heads} heads of width {self.head_dim}"
        )
        window = f", window {self.window}" if group == "masks" else ""
        return (
            f"gpu suite, {group}: {rows}; {dtype}, batch 1, {sizes}{window}; each repeat calls "
            f"a row for about {TARGET_MS:g} ms (times per call); ratios to {baseline} at the "
            f"same N, dtype and pass; the suite's time budget {self.budget:g} s (rows over it "
            "noted)"
        )

    def command(self) -> str:
        """The bench command line that repeats this run, every setting spelled out."""
        words = ["attn-zoo", "bench", "--suite", *self.suite]
        if self.lengths:
            words += ["--lengths", *map(str, self.lengths)]
        if self.backends:
            words += ["--backends", *self.backends]
        if self.ra_backends:
            words += ["--ra-backends", *self.ra_backends]
        options = {"--repeats": self.repeats, "--device": self.device}
        if {"window", "masks", "gpu"} & set(self.suite):
            options["--window"] = self.window
        if "gpu" in self.suite:
            options["--budget"] = self.budget
        if self.suite != ["generation"]:
            options |= {
                "--batch": self.batch, "--heads": self.heads, "--head-dim": self.head_dim,
                "--dtype": self.dtype, "--d-model": self.d_model, "--ra-heads": self.ra_heads,
                "--csv-dir": self.csv_dir,
            }  # fmt: skip
        options["--report"] = self.report
        for option, value in options.items():
            if value is not None:
                words += [option, str(value)]
        flags = {
            "--no-causal": self.no_causal,
            "--also-non-causal": self.also_non_causal,
            "--no-memory": self.no_memory,
        }
        words += [flag for flag, on in flags.items() if on]
        return shlex.join(words)


def _suite_tables(
    bench: BenchRun, suite: str, causal: bool, name: str, progress: Steps
) -> dict[str, tuple[pd.DataFrame, str]]:
    """A suite's tables by name, each with its settings line: the gpu suite's as
    gpu_<group>_<dtype>, any other suite's one table as `name`."""
    if suite != "gpu":
        return {name: (_suite_table(bench, suite, causal, progress), bench.title(suite, causal))}
    tables = bench_gpu(
        bench.suite_lengths(suite), bench.repeats, bench.device, bench.heads, bench.head_dim,
        bench.d_model, bench.ra_heads, bench.window, bench.budget, not bench.no_memory,
        progress=progress,
    )  # fmt: skip
    return {
        f"gpu_{group}_{dtype}": (table, bench.gpu_title(group, dtype))
        for (group, dtype), table in tables.items()
    }


def _suite_table(bench: BenchRun, suite: str, causal: bool, progress: Steps) -> pd.DataFrame:
    lengths, memory = bench.suite_lengths(suite), not bench.no_memory
    if suite == "softmax":
        return bench_softmax(
            lengths=lengths, backends=bench.backends, repeats=bench.repeats, device=bench.device,
            batch=bench.batch, heads=bench.heads, head_dim=bench.head_dim,
            causal=causal, dtype=bench.dtype, memory=memory, progress=progress,
        )  # fmt: skip
    if suite == "window":
        return bench_window(
            lengths=lengths, window=bench.window, repeats=bench.repeats, device=bench.device,
            batch=bench.batch, heads=bench.heads, head_dim=bench.head_dim, memory=memory,
            progress=progress,
        )  # fmt: skip
    if suite == "masks":
        return bench_masks(
            lengths=lengths, window=bench.window, repeats=bench.repeats, device=bench.device,
            heads=bench.heads, head_dim=bench.head_dim, memory=memory, progress=progress,
        )  # fmt: skip
    if suite == "mechanisms":
        return bench_mechanisms(
            lengths=lengths, repeats=bench.repeats, d_model=bench.d_model, heads=bench.heads,
            causal=causal, device=bench.device, memory=memory, progress=progress,
        )  # fmt: skip
    if suite == "generation":
        g = GENERATION_SIZES
        return bench_generation(
            lengths, bench.repeats, g["d_model"], g["n_layers"], g["heads"], g["prompt"],
            device=bench.device, threads=None, progress=progress,
        )  # fmt: skip
    return bench_relational(
        suite, lengths=lengths, repeats=bench.repeats, d_model=bench.d_model,
        heads=bench.ra_heads, causal=causal, device=bench.device, memory=memory,
        backends=bench.ra_backends, progress=progress,
    )  # fmt: skip


def run_bench(
    bench: BenchRun, out: Callable[[str], None] = print, console: Console | None = None
) -> dict[str, pd.DataFrame]:
    """Measure every suite of `bench` (causal, then non-causal with `also_non_causal`; the
    generation suite alone, with one torch thread for the whole run), print each table, write
    the CSVs and the report it asks for; the tables by name (<suite> or <suite>_noncausal).
    While a suite is measured, a bar of its measurements and the time left is drawn on
    `console`, or on stderr when it is a terminal (ablations.steps.make_steps); it is ended
    before the suite's table is printed."""
    from ablations.bench.report import write_bench_report
    from ablations.report.pages import write_csv

    bench.check()
    if bench.suite == ["generation"]:
        torch.set_num_threads(1)  # for the whole run, so the machine line names it
        modes = [True]
    else:
        modes = [not bench.no_causal]
        modes += [False] if bench.also_non_causal and not bench.no_causal else []
    out(f"machine: {machine()}")
    tables, settings = {}, {}
    for suite, causal in ((suite, causal) for suite in bench.suite for causal in modes):
        name = suite if causal == modes[0] else f"{suite}_noncausal"
        with make_steps(name, "measurements", console) as progress:
            measured = _suite_tables(bench, suite, causal, name, progress)
        for name, (table, title) in measured.items():
            tables[name] = table
            settings[name] = f"{title}, median of {bench.repeats}"
            out(f"\n{settings[name]}")
            out(table.to_string(index=False, float_format=lambda x: f"{x:.3g}", na_rep="-"))
            if bench.csv_dir:
                path = Path(bench.csv_dir) / f"bench_{name}.csv"
                path.parent.mkdir(parents=True, exist_ok=True)
                write_csv(table, path)
                out(f"wrote {path}")
    if bench.report:
        title = f"Attention benchmarks: {', '.join(bench.suite)} on {bench.device}"
        if bench.suite == ["generation"]:
            title = "Generation benchmark: cached vs uncached decoding"
        if bench.suite == ["gpu"]:
            title = (
                f"GPU benchmarks on {bench.device}: FlashAttention (torch SDPA) against flex, "
                "chunked, relational Triton, mask mods and flash-linear-attention"
            )
        folder = write_bench_report(tables, bench.report, title, settings, bench.command())
        out(f"\nwrote {folder}/report.md, {folder}/index.html and the CSVs and plots beside them")
    return tables
