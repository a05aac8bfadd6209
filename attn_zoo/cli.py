"""The ``attn-zoo`` command: ``attn-zoo bench ...``."""

from __future__ import annotations

import argparse
import sys

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _bench(args: argparse.Namespace) -> None:
    from attn_zoo.bench import bench_softmax, machine

    table = bench_softmax(
        lengths=args.lengths,
        backends=args.backends,
        repeats=args.repeats,
        device=args.device,
        batch=args.batch,
        heads=args.heads,
        head_dim=args.head_dim,
        causal=not args.no_causal,
        dtype=DTYPES[args.dtype],
    )
    print(f"softmax attention, batch {args.batch}, {args.heads} heads of width {args.head_dim}, "
          f"{'non-causal' if args.no_causal else 'causal'}, {args.dtype}, "
          f"median of {args.repeats}")  # fmt: skip
    print(f"machine: {machine()}")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}", na_rep="-"))
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-zoo", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="time and peak memory of every backend over N")
    b.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    b.add_argument("--backends", nargs="+", default=None, help="default: all usable here")
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--heads", type=int, default=8)
    b.add_argument("--head-dim", type=int, default=64)
    b.add_argument("--no-causal", action="store_true")
    b.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    b.add_argument("--device", default="cpu")
    b.add_argument("--csv", default=None, help="also write the table to this CSV file")
    b.set_defaults(func=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
