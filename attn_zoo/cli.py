"""The ``attn-zoo`` command.

attn-zoo bench [--suite softmax relational dual] [--lengths ...] [--csv-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DTYPES = ("bfloat16", "float16", "float32")
SUITES = ("softmax", "relational", "dual", "mechanisms")
DEFAULT_LENGTHS = {"softmax": [256, 512, 1024, 2048, 4096], "relational": [512, 1024, 2048, 4096]}


def _title(suite: str, args: argparse.Namespace) -> str:
    causal = "non-causal" if args.no_causal else "causal"
    if suite == "softmax":
        return (
            f"softmax attention kernel: batch {args.batch}, {args.heads} heads of width "
            f"{args.head_dim}, {causal}, {args.dtype}"
        )
    if suite == "mechanisms":
        return (
            f"attention layers: d_model {args.d_model}, {args.heads} heads, batch 1, {causal}, "
            "float32; ratios to standard attention on SDPA"
        )
    heads = args.ra_heads if suite == "relational" else f"{args.ra_heads}+{args.ra_heads}"
    return (
        f"{suite} attention layer: d_model {args.d_model}, {heads} heads, batch 1, {causal}, "
        "float32; standard_sdpa: standard attention with the same heads on SDPA"
    )


def _bench(args: argparse.Namespace) -> None:
    from attn_zoo.bench import bench_mechanisms, bench_relational, bench_softmax, machine

    print(f"machine: {machine()}")
    for suite in args.suite:
        lengths = args.lengths or DEFAULT_LENGTHS.get(suite, DEFAULT_LENGTHS["relational"])
        if suite == "softmax":
            table = bench_softmax(
                lengths=lengths, backends=args.backends, repeats=args.repeats, device=args.device,
                batch=args.batch, heads=args.heads, head_dim=args.head_dim,
                causal=not args.no_causal, dtype=args.dtype, memory=not args.no_memory,
            )  # fmt: skip
        elif suite == "mechanisms":
            table = bench_mechanisms(
                lengths=lengths, repeats=args.repeats, d_model=args.d_model,
                heads=args.heads, causal=not args.no_causal, device=args.device,
                memory=not args.no_memory,
            )  # fmt: skip
        else:
            table = bench_relational(
                suite, lengths=lengths, repeats=args.repeats, d_model=args.d_model,
                heads=args.ra_heads, causal=not args.no_causal, device=args.device,
                memory=not args.no_memory,
            )  # fmt: skip
        title = _title(suite, args)
        print(f"\n{title}, median of {args.repeats}")
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}", na_rep="-"))
        if args.csv_dir:
            path = Path(args.csv_dir) / f"bench_{suite}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(path, index=False)
            print(f"wrote {path}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-zoo", description="attn_zoo command line")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="time and peak memory of every backend over N")
    b.add_argument("--suite", nargs="+", choices=SUITES, default=list(SUITES))
    b.add_argument("--lengths", type=int, nargs="+", default=None, help="default per suite")
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--no-causal", action="store_true")
    b.add_argument("--device", default="cpu")
    b.add_argument("--no-memory", action="store_true", help="skip the peak memory measurement")
    b.add_argument("--csv-dir", default=None, help="also write bench_<suite>.csv files here")
    k = b.add_argument_group("softmax suite")
    k.add_argument("--backends", nargs="+", default=None, help="default: all usable here")
    k.add_argument("--batch", type=int, default=1)
    k.add_argument("--heads", type=int, default=8)
    k.add_argument("--head-dim", type=int, default=64)
    k.add_argument("--dtype", choices=DTYPES, default="float32")
    r = b.add_argument_group("relational and dual suites")
    r.add_argument("--d-model", type=int, default=512)
    r.add_argument(
        "--ra-heads", type=int, default=4, help="relational heads (dual: and as many standard)"
    )
    b.set_defaults(func=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
