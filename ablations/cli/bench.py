"""``attn-zoo bench``: time and peak memory of the backends (ablations/bench/)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from ablations.arguments import COUNT, Help, number
from ablations.bench import DTYPES, GPU_BUDGET, SUITES
from ablations.cli.common import add_import, import_plugins


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``bench`` command and its options."""
    b = sub.add_parser(
        "bench", help="time and peak memory of every backend over N", formatter_class=Help,
        description="Time (median of interleaved repeats) and peak memory of the backends.",
    )  # fmt: skip
    b.add_argument(
        "--suite", nargs="+", choices=[*SUITES, "generation", "window", "masks", "gpu"],
        default=list(SUITES),
        help=f"which suites to run (default: {' '.join(SUITES)}); generation (tokens per second, "
        "cached vs uncached) runs on its own; window: a sliding window as a mask mod against "
        "the same window as a dense mask; masks: window, document, prefix LM and a combination "
        "as mask mods on chunked against dense masks on sdpa; gpu (on its own, --device cuda): "
        "FlashAttention against flex, chunked, relational Triton, mask mods on flex and "
        "flash-linear-attention, bfloat16 and float32, within --budget",
    )  # fmt: skip
    b.add_argument("--lengths", type=COUNT, nargs="+", default=None,
                   help="sequence lengths N (without: each suite's own list)")  # fmt: skip
    b.add_argument("--repeats", type=COUNT, default=5, help="timed repeats per workload")
    b.add_argument("--no-causal", action="store_true", help="time non-causal attention only")
    b.add_argument(
        "--also-non-causal", action="store_true",
        help="measure each suite causal, then non-causal (tables <suite>, <suite>_noncausal)",
    )  # fmt: skip
    b.add_argument("--device", default="cpu", help="torch device to run on")
    b.add_argument("--no-memory", action="store_true", help="skip the peak memory measurement")
    b.add_argument("--csv-dir", default=None, help="also write bench_<suite>.csv files here")
    b.add_argument(
        "--report", default=None, metavar="DIR",
        help="also write a report here: report.md, index.html, CSVs and plots",
    )  # fmt: skip
    k = b.add_argument_group("softmax suite")
    k.add_argument("--backends", nargs="+", default=None,
                   help="softmax backends to time (without: all usable here)")  # fmt: skip
    k.add_argument("--batch", type=COUNT, default=1, help="batch size B")
    k.add_argument("--heads", type=COUNT, default=8, help="attention heads H")
    k.add_argument("--head-dim", type=COUNT, default=64, help="head width d")
    k.add_argument("--dtype", choices=DTYPES, default="float32", help="input dtype")
    k.add_argument("--window", type=COUNT, default=64, help="window suite: keys in the window")
    r = b.add_argument_group("relational and dual suites")
    r.add_argument("--d-model", type=COUNT, default=512, help="layer width d_model")
    r.add_argument(
        "--ra-heads", type=COUNT, default=4, help="relational heads (dual: and as many standard)"
    )
    r.add_argument(
        "--ra-backends", nargs="+", default=None,
        help="our backends to time (without: auto and all); reference and standard_sdpa always",
    )  # fmt: skip
    g = b.add_argument_group("gpu suite")
    g.add_argument(
        "--budget", type=number(float, 0, low_open=True), default=GPU_BUDGET, metavar="SECONDS",
        help="time for all its tables: a row whose next N would not fit is skipped (noted)",
    )  # fmt: skip
    add_import(b)
    b.set_defaults(func=bench)


def bench(args: argparse.Namespace) -> None:
    from ablations.bench.suites import BenchRun, run_bench

    import_plugins(args)
    bench = BenchRun(**{f.name: getattr(args, f.name) for f in fields(BenchRun)})
    try:
        run_bench(bench)
    except (ValueError, OSError) as err:  # a bad setting, a folder that cannot be written
        raise SystemExit(f"error: {err}") from None
