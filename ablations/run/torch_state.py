"""The process-wide torch settings a cell trains under: torch's defaults, before every cell.

Some of torch's state is global to a process and changes results: the default dtype (a model
built after `torch.set_default_dtype(torch.float64)` trains in float64), deterministic
algorithms, the float32 matmul precision, the TF32 and cuDNN flags, whether autograd records.
A plugin, or any code a worker imports, can change it; the cell's key and the store would
still say float32. So a cell's result depends on its config alone: `train_cell`
(ablations/run/train.py) puts this state back to torch's defaults (`DEFAULTS`) before every cell,
with a note naming what had changed, and fails a cell whose own model building changes it (a
mechanism's `__init__` setting the default dtype, say). The thread count is the grid's, set
by the worker beside it. A resume checkpoint records `torch_state()` with the other inputs of
a cell (ablations/run/resume.py).

    changed = reset_torch_state()   # ["default_dtype float64 -> float32"]; [] if none was
"""

from __future__ import annotations

import torch

DEFAULTS = {  # torch's own defaults
    "default_dtype": "float32",
    "deterministic_algorithms": False,
    "float32_matmul_precision": "highest",
    "grad_enabled": True,
    "cudnn_benchmark": False,
    "cudnn_deterministic": False,
    "cudnn_allow_tf32": True,
    "cuda_matmul_allow_tf32": False,
}


def torch_state() -> dict[str, str | bool]:
    """This process's (and thread's: autograd's) values of the settings of `DEFAULTS`."""
    return {
        "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "grad_enabled": torch.is_grad_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }


def changes(state: dict[str, str | bool]) -> list[str]:
    """The settings where `state` differs from `DEFAULTS`: ["default_dtype float64 -> float32"]."""
    return [f"{name} {state[name]} -> {value}" for name, value in DEFAULTS.items()
            if state[name] != value]  # fmt: skip


def reset_torch_state() -> list[str]:
    """Put the settings of `DEFAULTS` back to them; returns what had changed (`changes`)."""
    changed = changes(torch_state())
    if changed:
        torch.set_default_dtype(getattr(torch, DEFAULTS["default_dtype"]))
        torch.use_deterministic_algorithms(DEFAULTS["deterministic_algorithms"])
        torch.set_float32_matmul_precision(DEFAULTS["float32_matmul_precision"])
        torch.set_grad_enabled(DEFAULTS["grad_enabled"])
        torch.backends.cudnn.benchmark = DEFAULTS["cudnn_benchmark"]
        torch.backends.cudnn.deterministic = DEFAULTS["cudnn_deterministic"]
        torch.backends.cudnn.allow_tf32 = DEFAULTS["cudnn_allow_tf32"]
        torch.backends.cuda.matmul.allow_tf32 = DEFAULTS["cuda_matmul_allow_tf32"]
    return changed
