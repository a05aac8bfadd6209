"""Pinned numerics: a few tiny cells (one CPU thread, a couple of seconds each: softmax,
relational, additive, linear and differential attention, trained and evaluated) whose final
metrics, learning curves and kernel choices are committed in tests/pinned_numerics.json. Any
change to what they compute fails the suite, naming the cell and the first evaluated step that
moved: a kernel, a default or an initialisation that changed numbers a committed report rests
on is seen here, not in a rerun months later.

On the machine the values were written on (same torch, same CPU model) every number must be
equal to the bit; elsewhere within a relative 1e-4 (another CPU may sum in another order). A
change that is meant: write the new values and say why, in one step,

    make pinned-numerics REASON="the chunked kernel's tiles grew from 64 to 128"

which reruns the cells, rewrites the JSON and appends a dated line to tests/numerics_log.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: the repository's packages

from ablations.grid.cell import Cell  # noqa: E402
from ablations.run.train import train_cell  # noqa: E402
from attn_zoo.kernels.dispatch import recording_choices  # noqa: E402

VALUES = HERE / "pinned_numerics.json"
LOG = HERE / "numerics_log.md"
TIMING = ("wall_s", "step_ms")  # the only metrics that differ between two runs of a cell
RELATIVE = 1e-4  # off the machine the values were written on
SYMBOLS = {"symbol_retrieval": "positional_symbols", "symbol_retrieval_kwargs": {"max_length": 8}}
MECHANISMS = {  # cell name -> (mechanism, kwargs, model options)
    "standard": ("standard", {"n_heads": 2}, {}),
    "relational": ("relational", {"n_heads": 2, "n_relations": 2}, SYMBOLS),
    "additive": ("additive", {"n_heads": 2}, {}),
    "linear": ("linear", {"n_heads": 2}, {}),
    "differential": ("differential", {"n_heads": 2}, {}),
}


def pinned_cell(name: str) -> Cell:
    mechanism, kwargs, options = MECHANISMS[name]
    return Cell(
        grid="pinned", task="same_pair", task_name="same_pair",
        task_kwargs={"n_train": 128, "n_validation": 32, "n_test": 32},
        size={"label": "xs", "d_model": 16, "n_layers": 1, **options},
        mechanism=name, mechanism_name=mechanism, mechanism_kwargs=kwargs,
        training={"steps": 12, "eval_every": 4, "batch_size": 16}, seed=0,
    )  # fmt: skip


def machine() -> dict[str, str]:
    """What bitwise equality needs to be the same: torch and the CPU model."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return {"torch": torch.__version__, "cpu": models[0] if models else platform.machine()}


def compute(name: str) -> dict:
    """The cell's numbers, one thread: final metrics (not its timing), curve, kernel choices."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with recording_choices() as choices:
            result = train_cell(pinned_cell(name))
    finally:
        torch.set_num_threads(threads)
    return {
        "metrics": {k: v for k, v in sorted(result.metrics.items()) if k not in TIMING},
        "curve": result.curve,
        "kernels": sorted({f"{c.family}:{c.chosen}" for c in choices}),
    }


def first_difference(pinned: dict, now: dict, exact: bool) -> str | None:
    """Where `now` moved from `pinned`: the first evaluated step, else the metric or kernels."""

    def same(a: float, b: float) -> bool:
        if exact or not (isinstance(a, float) and isinstance(b, float)):
            return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
        return math.isclose(a, b, rel_tol=RELATIVE)

    if pinned["kernels"] != now["kernels"]:
        return f"kernels {pinned['kernels']} then, {now['kernels']} now"
    for was, point in zip(pinned["curve"], now["curve"], strict=False):
        for field, a, b in zip(("train_loss", "val_loss", "val_metric"), was[1:], point[1:],
                               strict=True):  # fmt: skip
            if was[0] != point[0] or not same(a, b):
                return f"step {was[0]}: {field} {a!r} then, {b!r} now"
    if len(pinned["curve"]) != len(now["curve"]):
        return f"{len(pinned['curve'])} evaluated steps then, {len(now['curve'])} now"
    for key in sorted(set(pinned["metrics"]) | set(now["metrics"])):
        a, b = pinned["metrics"].get(key), now["metrics"].get(key)
        if a is None or b is None or not same(a, b):
            return f"final {key}: {a!r} then, {b!r} now"
    return None


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_a_pinned_cell_computes_what_it_did(name):
    pinned = json.loads(VALUES.read_text())
    exact = pinned["machine"] == machine()
    moved = first_difference(pinned["cells"][name], compute(name), exact)
    assert moved is None, (
        f"pinned cell {name!r} moved ({'bitwise' if exact else f'relative {RELATIVE}'}): "
        f"{moved}. If meant: make pinned-numerics REASON='why'"
    )


def test_every_pinned_cell_has_values_and_the_log_says_why():
    pinned = json.loads(VALUES.read_text())
    assert set(pinned["cells"]) == set(MECHANISMS)
    assert pinned["written"] in LOG.read_text()  # each writing of the values has its line


def write(reason: str) -> None:
    """Recompute every pinned cell, rewrite the values and log the reason."""
    written = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cells = {name: compute(name) for name in MECHANISMS}
    data = {"written": written, "machine": machine(), "cells": cells}
    VALUES.write_text(json.dumps(data, indent=1) + "\n")
    with LOG.open("a", encoding="utf-8") as log:
        log.write(f"- {written}: {reason} (torch {data['machine']['torch']}, "
                  f"{data['machine']['cpu']})\n")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="rewrite the pinned numerics and log why")
    parser.add_argument("--write", metavar="REASON", required=True, help="why they changed")
    write(parser.parse_args().write)
