"""Devices and precision as a grid names them, and whether this machine has them.

A grid's `training.device` is "auto", "cpu", "cuda", "cuda:N" or "mps" (`DEVICES`);
`device_problem` and `precision_problem` are checked when a grid loads, so a device this
machine lacks is refused before anything runs (status and report skip the check, to read a
grid trained elsewhere). bf16 autocast runs on CUDA and CPU, not MPS. Where a cell is placed
and what it resolves to when it trains: ablations/run/devices.py.
"""

from __future__ import annotations

import re

import torch

DEVICES = 'one of "auto", "cpu", "cuda", "cuda:N" (N an int >= 0), "mps"'
# What each Ray task of a cell asks for unless the grid's [resources] says otherwise
RESOURCE_DEFAULTS = {"num_cpus": 1, "num_gpus": 0}


def is_device_name(value: str) -> bool:
    """Whether `value` is one of `DEVICES` (whether this machine has it: `device_problem`)."""
    return re.fullmatch(r"auto|cpu|cuda|cuda:\d+|mps", value) is not None


def device_problem(
    device: str, cuda_devices: int | None = None, mps: bool | None = None
) -> str | None:
    """Why `device` cannot be trained on here (None: it can, or it is "auto"): "cuda" needs
    CUDA, "cuda:N" N < the device count, "mps" the MPS backend. `cuda_devices` and `mps`
    default to what torch sees on this machine."""
    if device in ("auto", "cpu"):
        return None
    if device == "mps":
        if mps is None:
            mps = torch.backends.mps.is_available()
        return None if mps else "torch.backends.mps.is_available() is False"
    if cuda_devices is None:
        cuda_devices = gpu_count()
    if cuda_devices == 0:
        return "torch.cuda.is_available() is False"
    index = int(device.partition(":")[2] or 0)
    if index >= cuda_devices:
        return f"torch.cuda.device_count() is {cuda_devices}"
    return None


def precision_problem(precision: str, device: str) -> str | None:
    """Why `precision` cannot be used on `device` (None: it can): bf16 autocast runs on CUDA
    and CPU, not MPS. (Whether a CUDA GPU has bf16 is checked where the cell trains.)"""
    if precision == "bf16" and device == "mps":
        return "bf16 autocast runs on CUDA and CPU, not on MPS"
    return None


def gpu_count() -> int:
    """The CUDA devices torch sees in this process (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
