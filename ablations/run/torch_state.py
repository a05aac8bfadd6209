"""The process-wide torch settings a cell trains under: torch's defaults, before every cell.

Some of torch's state is global to a process and changes results: the default dtype (a model
built after `torch.set_default_dtype(torch.float64)` trains in float64), deterministic
algorithms, the float32 precision of matmuls and convolutions (TF32, bfloat16: torch's
`fp32_precision` settings, or the legacy `set_float32_matmul_precision` and `allow_tf32`),
cuDNN's benchmark mode, oneDNN (mkldnn) on or off, which kernels scaled_dot_product_attention
may use, whether autograd records. A plugin, or any code a worker imports, can
change it; the cell's key and the store would still say float32. So a cell's result depends on
its config alone: `train_cell` (ablations/run/train.py) puts this state back to torch's
defaults (`DEFAULTS`) before every cell, with a note naming what had changed, and fails a cell
whose model building, training or evaluation changes it (a mechanism's `__init__` or
`forward` setting the default dtype, say). The thread count is the grid's, set by the worker
beside it. A resume checkpoint records `torch_state()` with the other inputs of a cell
(ablations/run/resume.py).

    changed = reset_torch_state()   # ["default_dtype float64 -> float32"]; [] if none was
"""

from __future__ import annotations

import torch

# torch's fp32_precision settings (torch >= 2.9; older torch: the legacy flags instead), by
# their path under torch.backends ("": torch.backends.fp32_precision), and their defaults
PRECISIONS = {"": "none", "cuda.matmul": "none", "cudnn": "none", "cudnn.conv": "tf32",
              "cudnn.rnn": "tf32", "mkldnn": "none", "mkldnn.matmul": "none",
              "mkldnn.conv": "none", "mkldnn.rnn": "none"}  # fmt: skip
NEW_API = hasattr(torch.backends, "fp32_precision")
LEGACY = {"float32_matmul_precision": "highest", "cudnn_allow_tf32": True,
          "cuda_matmul_allow_tf32": False}  # fmt: skip
# scaled_dot_product_attention's kernels (torch.backends.cuda.enable_<kernel>_sdp): turning
# one off changes which computes sdpa, on the CPU too (a flash kernel off: 6e-7 off)
SDP_KERNELS = tuple(k for k in ("flash", "mem_efficient", "math", "cudnn")
                    if hasattr(torch.backends.cuda, f"{k}_sdp_enabled"))  # fmt: skip
DEFAULTS = {  # torch's own defaults
    "default_dtype": "float32",
    "deterministic_algorithms": False,
    "grad_enabled": True,
    "cudnn_benchmark": False,
    "cudnn_deterministic": False,
    "mkldnn_enabled": True,
    **{f"{kernel}_sdp_enabled": True for kernel in SDP_KERNELS},
    **({f"fp32_precision {path}".strip(): v for path, v in PRECISIONS.items()} if NEW_API
       else LEGACY),
}  # fmt: skip


def _backend(path: str):
    """The torch.backends module or object at `path` ("cuda.matmul")."""
    found = torch.backends
    for part in filter(None, path.split(".")):
        found = getattr(found, part)
    return found


def _precision(path: str) -> str:
    """`path`'s fp32_precision; "ieee" (full precision, what the legacy flags set) read as the
    "none" it is by default where that is the default."""
    value = _backend(path).fp32_precision
    return "none" if value == "ieee" and PRECISIONS[path] == "none" else value


def torch_state() -> dict[str, str | bool]:
    """This process's (and thread's: autograd's) values of the settings of `DEFAULTS` (never
    through the legacy getters where torch has the new ones: they raise once a plugin used
    the new API)."""
    state = {
        "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "grad_enabled": torch.is_grad_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
        **{f"{k}_sdp_enabled": getattr(torch.backends.cuda, f"{k}_sdp_enabled")()
           for k in SDP_KERNELS},
    }  # fmt: skip
    if NEW_API:
        return state | {f"fp32_precision {path}".strip(): _precision(path) for path in PRECISIONS}
    return state | {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }


def changes(state: dict[str, str | bool], put_back: bool = True) -> list[str]:
    """The settings where `state` differs from `DEFAULTS`, as they are put back
    (["default_dtype float64 -> float32"]) or, `put_back` False, as they were changed
    (["default_dtype float32 -> float64"])."""
    return [f"{name} {state[name]} -> {value}" if put_back else f"{name} {value} -> {state[name]}"
            for name, value in DEFAULTS.items() if state[name] != value]  # fmt: skip


def reset_torch_state() -> list[str]:
    """Put the settings of `DEFAULTS` back to them; returns what had changed (`changes`)."""
    changed = changes(torch_state())
    if changed:
        torch.set_default_dtype(getattr(torch, DEFAULTS["default_dtype"]))
        torch.use_deterministic_algorithms(DEFAULTS["deterministic_algorithms"])
        torch.set_grad_enabled(DEFAULTS["grad_enabled"])
        torch.backends.cudnn.benchmark = DEFAULTS["cudnn_benchmark"]
        torch.backends.cudnn.deterministic = DEFAULTS["cudnn_deterministic"]
        torch.backends.mkldnn.enabled = DEFAULTS["mkldnn_enabled"]
        for kernel in SDP_KERNELS:
            getattr(torch.backends.cuda, f"enable_{kernel}_sdp")(DEFAULTS[f"{kernel}_sdp_enabled"])
        torch.set_float32_matmul_precision(LEGACY["float32_matmul_precision"])  # the legacy
        torch.backends.cudnn.allow_tf32 = LEGACY["cudnn_allow_tf32"]  # flags first: they set
        torch.backends.cuda.matmul.allow_tf32 = LEGACY["cuda_matmul_allow_tf32"]  # the new
        for path, value in PRECISIONS.items() if NEW_API else ():
            if _precision(path) != value:
                _backend(path).fp32_precision = value
    return changed
