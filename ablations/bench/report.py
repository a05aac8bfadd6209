"""The benchmark report: one writer for every suite's tables.

    write_bench_report({"softmax": table, ...}, "reports/benchmarks", title, settings, command)

Per suite: its settings line, its table as shown (times, memory and ratios for kernel and layer
suites; tokens per second and the cached speedup for generation), the notes of refused calls,
bench_<suite>.csv, and log-log plots against N (`Plot`). The page opens with the machine, the
date and the command that writes the report again; its notes say how each number was measured
(`NOTES`, or `GENERATION_NOTES` for a generation report). matplotlib and jinja2 are imported
only when writing: the process that measures memory imports ablations.bench.measure alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ablations.bench.measure import machine

if TYPE_CHECKING:
    from matplotlib.axes import Axes

BASELINES = ("sdpa", "standard_sdpa", "standard:sdpa", "reference")  # whichever a suite has
LINESTYLES = ("-", "--", ":", "-.")  # one per baseline on a ratio plot
NOTES = (
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


@dataclass(frozen=True)
class Plot:
    """A log-log plot against N: `lines` ({column: (linestyle, legend)}) of each backend,
    `ylabel`, file <kind>_<suite>.png; `unit` draws a line at 1 (ratios); `rows` keeps the
    backends whose name ends with it ('' all)."""

    kind: str
    lines: dict[str, tuple[str, str]]
    ylabel: str
    unit: bool = False
    rows: str = ""


def _number(value: float) -> str:
    """A table cell: '-' for NaN, else three significant digits (whole numbers from 100)."""
    if pd.isna(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _is_generation(table: pd.DataFrame) -> bool:
    return "tokens_per_s" in table


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    """A suite's table as shown, by header: per (N, backend), times, peak memory and ratios to
    the suite's baselines; for generation, tokens per second, ms per token and speedup."""
    shown = {"N": table.N.astype(str), "backend": table.backend.astype(str)}
    if _is_generation(table):
        shown["new tokens"] = table.new_tokens.astype(str)
        columns = {"tokens_per_s": "tokens/s", "ms_per_token": "ms/token", "speedup": "speedup"}
    else:
        columns = {"fwd_ms": "fwd ms", "fwd_bwd_ms": "fwd+bwd ms", "train_peak_mb": "peak MiB"}
        for base in _baselines(table):
            columns[f"fwd_vs_{base}"] = f"fwd vs {base}"
            columns[f"time_vs_{base}"] = f"fwd+bwd vs {base}"
            columns[f"mem_vs_{base}"] = f"memory vs {base}"
        if not table.train_peak_mb.notna().any():  # memory not measured
            columns = {c: h for c, h in columns.items() if not c.startswith(("train", "mem_vs"))}
    shown |= {header: table[column].map(_number) for column, header in columns.items()}
    return pd.DataFrame(shown).reset_index(drop=True)


def _baselines(table: pd.DataFrame) -> list[str]:
    return [base for base in BASELINES if f"time_vs_{base}" in table]


def _plots(table: pd.DataFrame) -> list[Plot]:
    if _is_generation(table):
        return [
            Plot("tokens", {"tokens_per_s": ("-", "tokens per second")}, "tokens per second"),
            Plot("speedup", {"speedup": ("-", "cached speedup over uncached")},
                 "cached speedup over uncached", unit=True, rows=":cached"),
        ]  # fmt: skip
    ratios = {f"time_vs_{b}": (LINESTYLES[i], f"vs {b}") for i, b in enumerate(_baselines(table))}
    return [
        Plot("time", {"fwd_bwd_ms": ("-", "fwd+bwd"), "fwd_ms": ("--", "fwd")}, "time (ms)"),
        Plot("memory", {"train_peak_mb": ("-", "fwd+bwd")}, "training peak memory (MiB)"),
        Plot("ratio", ratios, "fwd+bwd time ratio to the baseline", unit=True),
    ]


def _notes(table: pd.DataFrame) -> list[str]:
    """Why backends refused calls: 'backend at N = n, ...: note', one item per (backend, note)."""
    if "note" not in table:
        return []
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


def write_bench_report(
    tables: dict[str, pd.DataFrame],
    out_dir: str | Path,
    title: str,
    settings: dict[str, str],
    command: str,
) -> Path:
    """Write a report of bench tables measured on this machine ({suite: table of
    ablations.bench.suites}) into `out_dir` (created if missing): report.md, a self-contained
    index.html, and per suite bench_<suite>.csv and its plots (`_plots`: time_, memory_ and
    ratio_<suite>.png, or tokens_ and speedup_generation.png). `settings` names each suite's
    settings and `command` the command line that writes the report again. Returns `out_dir`."""
    from ablations.report.pages import (
        Bullets,
        Image,
        Page,
        Paragraph,
        Section,
        Table,
        file_name,
        generated_now,
        label_colours,
        new_figure,
        write_csv,
        write_pages,
    )

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    facts = [
        f"Machine: {machine()}",
        f"Generated: {generated_now()}",
        f"Command: {command}",
    ]
    generation = all(_is_generation(table) for table in tables.values())
    page = Page(title, facts, GENERATION_NOTES if generation else NOTES)
    for suite, table in tables.items():
        write_csv(table, folder / f"bench_{suite}.csv")
        section = Section(f"Suite: {suite}")
        section.parts.extend([Paragraph(settings[suite]), Table(_shown(table))])
        if notes := _notes(table):
            section.parts.append(Bullets(notes))
        page.sections.append(section)
        backends = set(table.backend)
        colours = label_colours(backends)
        for plot in _plots(table):
            rows = table[table.backend.str.endswith(plot.rows)]
            if not plot.lines or not (rows[list(plot.lines)] > 0).to_numpy().any():
                continue
            figure, ax = new_figure()
            _plot_lines(ax, rows, plot.lines, colours)
            if plot.unit:
                ax.axhline(1, color="grey", linewidth=0.8)
            ax.set(ylabel=plot.ylabel, title=f"{suite}: {plot.ylabel}")
            if generation:
                ax.set(xlabel="total length N")
            name = file_name(plot.kind, suite)
            figure.savefig(folder / name, dpi=100)
            section.parts.append(Image(name, f"{suite}: {plot.ylabel} against N"))
    write_pages(page, folder)
    return folder
