"""Devices and precision at run time: what a cell's setting resolves to, where it is placed.

- Resolved in the worker that trains a cell (`resolve_device`, `compute_dtype`): "auto" is the
  current CUDA device where torch sees one, else the CPU (MPS only when named).
- Placed by an executor (`local_placement`, `default_local_workers`, `ray_device_problem`):
  the local executor puts worker i on cuda:(i mod GPUs) for "auto" and "cuda" cells where this
  machine has GPUs, one worker per GPU by default; Ray shows a task only the GPUs it asked for
  (`[resources]`, `RESOURCE_DEFAULTS`).

What a grid may name, and whether this machine has it: ablations/grid/devices.py.
"""

from __future__ import annotations

import os

import torch

from ablations.grid.devices import RESOURCE_DEFAULTS, gpu_count


def slow_precision(
    precision: str,
    device: str,
    cuda_devices: int | None = None,
    native_bf16: bool | None = None,
) -> str | None:
    """Why cells with `precision` whose `training.device` is `device` will train slowly on
    this machine's local workers (None: no reason known): bf16 autocast on a CPU without
    a bfloat16 path in oneDNN (`cpu_has_bf16`), which torch emulates (the Makefile's comment on
    fastformer-shakespeare gives a step's time on the 2-core machine both ways).
    `cuda_devices` and `native_bf16` default to what torch sees here."""
    if cuda_devices is None:
        cuda_devices = gpu_count()
    if precision != "bf16" or placement(0, cuda_devices, device) != "cpu":
        return None
    if native_bf16 is None:
        native_bf16 = cpu_has_bf16()
    if native_bf16 is not False:
        return None
    return (
        "training.precision = 'bf16' on this CPU, for which oneDNN has no bfloat16 path "
        "(torch.ops.mkldnn._is_mkldnn_bf16_supported() is False; no AVX-512): torch emulates "
        "it, so each step takes many times as long as in 'float32'"
    )


def cpu_has_bf16() -> bool | None:
    """Whether torch's CPU kernels (oneDNN) have a bfloat16 path on this CPU (AVX-512 or
    newer); None where this torch cannot say (the check is a private op)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return None


def resolve_device(setting: str) -> str:
    """The device a cell whose `training.device` is `setting` trains on in this process:
    "auto" is the current CUDA device where torch sees one, else "cpu" (never MPS); "cuda" the
    current CUDA device (RuntimeError without one); others as they are."""
    if setting in ("auto", "cuda"):
        if torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()}"
        if setting == "cuda":
            raise RuntimeError(
                "training.device = 'cuda' but torch.cuda.is_available() is False in this worker"
            )
        return "cpu"
    return setting


def compute_dtype(precision: str, device: str) -> torch.dtype:
    """The dtype forward passes run in: bfloat16 for "bf16" (autocast; RuntimeError where it
    cannot run: MPS, a CUDA GPU without bf16), else float32."""
    if precision != "bf16":
        return torch.float32
    kind = torch.device(device).type
    if kind == "mps":
        raise RuntimeError("training.precision = 'bf16': bf16 autocast runs on CUDA and CPU")
    if kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise RuntimeError(
            f"training.precision = 'bf16' on {device}: torch.cuda.is_bf16_supported() is False"
        )
    return torch.bfloat16


def usable_cpus() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (so that
    ``taskset -c 1 attn-zoo ablate run ...`` beside another run takes one core), else every
    core."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def placement(index: int, n_gpus: int, device: str) -> str:
    """The device local worker `index` trains a cell with `training.device` = `device` on,
    where this machine has `n_gpus` GPUs: "auto" and "cuda" are cuda:(index mod n_gpus) when
    there are GPUs ("auto": "cpu" when none); any other device is itself."""
    if device in ("auto", "cuda") and n_gpus > 0:
        return f"cuda:{index % n_gpus}"
    return "cpu" if device == "auto" else device


def placements(workers: int, n_gpus: int, device: str) -> list[str]:
    """The device of each of `workers` local workers (`placement`): one worker per GPU,
    round-robin when there are more workers than GPUs."""
    return [placement(i, n_gpus, device) for i in range(workers)]


def local_placement(index: int, n_gpus: int, device: str) -> str | None:
    """The GPU local worker `index` is handed for a cell with `training.device` = `device`
    (`placement`), or None where the cell's own setting decides (no GPU here, or a device it
    names itself)."""
    if device in ("auto", "cuda") and n_gpus:
        return placement(index, n_gpus, device)
    return None


def cell_threads(resources: dict | None = None) -> int:
    """The torch threads every cell of a grid trains with, whatever the executor and its number
    of workers: its `[resources]` num_cpus (default 1), whole, at least 1. Held fixed, so that
    a grid's results do not depend on how many workers ran it (another thread count changes
    the order of floating-point sums: ablations/bench/variance.py measures by how much)."""
    return max(1, int({**RESOURCE_DEFAULTS, **(resources or {})}["num_cpus"]))


def default_local_workers(device: str, threads: int = 1) -> int:
    """The local executor's workers for cells on `device` that train with `threads` torch
    threads each: one per GPU where they train on this machine's GPUs ("auto", "cuda"), else
    as many as the cores this process may use hold (at least one)."""
    on_gpus = gpu_count() if device in ("auto", "cuda") else 0
    return on_gpus or max(1, usable_cpus() // threads)


def attempted_device(setting: str, placed: str | None) -> str:
    """The device a cell was to train on, for the record of a cell that failed: its placement,
    else its setting resolved here (the setting itself where that fails)."""
    try:
        return placed or resolve_device(setting)
    except Exception:
        return setting


def ray_device_problem(device: str, num_gpus: float) -> str | None:
    """Why cells on `device` cannot run as Ray tasks asking for `num_gpus` GPUs (None: they
    can): Ray hides every GPU from a task that asks for none."""
    if device.startswith("cuda") and not num_gpus:
        return (
            f"training.device = {device!r} with executor='ray' needs resources.num_gpus > 0 "
            "(Ray hides the GPUs from a task that asks for none); or use device 'auto'"
        )
    return None
