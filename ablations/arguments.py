"""Argument types and the help format shared by the ``attn-zoo`` command (ablations/cli/)
and the module commands (``python -m ablations.bench.engine_overhead``): a number in a range,
refused with the valid range, and option help that ends with the default."""

from __future__ import annotations

import argparse
import math


def number(kind: type, low: float, high: float | None = None, low_open: bool = False):
    """An argparse `type=`: a `kind` (int, or a finite float) >= `low` (> `low` with `low_open`)
    and <= `high`; anything else an ArgumentTypeError naming the valid range (exit status 2)."""
    if high is None:
        valid = f"{kind.__name__} {'>' if low_open else '>='} {low:g}"
    else:
        valid = f"{kind.__name__} in {'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (
            value is None
            or (kind is float and not math.isfinite(value))
            or (value <= low if low_open else value < low)
            or (high is not None and value > high)
        ):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: valid is {valid}")
        return value

    parse.__name__ = valid
    return parse


COUNT = number(int, 1)  # workers, repeats, sizes, lengths


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the default is None or False (the
    help then says what happens without it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        skip = action.default in (None, False, argparse.SUPPRESS) or action.default == []
        if skip or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)
