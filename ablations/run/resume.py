"""Resume checkpoints: a cell interrupted mid-way (a killed run, a lost worker) trains on from
its last checkpoint when it runs again, and ends with exactly the metrics and curve of a run
that was never interrupted (bitwise on CPU: every part trains with the same torch thread count,
which `load_state` checks).

    plan = ResumePlan(every_steps=0, every_seconds=300.0, data=None)   # what a worker is given
    data = save_state(cell, loop, model, optimizer, schedule, batches, device, inputs)
    loop = load_state(data, cell, model, optimizer, schedule, batches, device, inputs)

A checkpoint holds the inputs that can change a result besides the cell's config (its `inputs`:
the digests of the data files the task read and of the plugins' code, torch's global state,
ablations/run/torch_state.py, and the code's commit; and, as it is written, a digest of each
file of the plugins' code and data, a helper they import from another folder and a module loaded
from their folders by then however it was imported (importlib in a forward) included:
`loaded_record`) and everything the training loop (ablations.run.train) carries from one step to
the next: the model's weights, the optimizer's and LR schedule's state, every random state
(torch's CPU generator and the device's, Python's `random`, NumPy's, and the generator that
draws the batches: the position in the data order) and the `LoopState` (step, curve so far, last
validation metrics, early-stopping state, training seconds). It is no part of the cell's config
or key: how often checkpoints are taken changes no result.

Its bytes are `MAGIC`, the SHA-256 of the payload, then the payload (torch.save of a dict of
tensors and plain values, read back with `weights_only=True`). `load_state` trusts only a
checkpoint whose checksum holds and that was written for the same cell config, from the same
inputs (a data file or plugin edited since, a loaded plugin file edited or gone, or another
default dtype, would mix two trainings under one result), by the same torch and attn_zoo, on the
same kind of device, with the same torch thread count (`torch.get_num_threads()`), before the
cell's last step; it raises `ResumeError` (the cell trains from step 0, its note saying which
input changed, and of the plugins which files: `_changed_plugins`) before it changes anything.
The thread count changes how a CPU sums (a cell checkpointed with 2 threads and resumed with 1
ended with val_loss 1.6354334, not the uninterrupted 1.6354336), so a checkpoint of another
count is not resumed: a resumed result is always the uninterrupted one.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

import attn_zoo
from ablations.grid.cell import Cell
from ablations.grid.plugins import loaded_plugin_files, plugin_files
from ablations.run.provenance import file_sha256, short_record

MAGIC = b"attn_zoo resume checkpoint 2\n"  # 2: with the cell's inputs
KEYS = ("config", "inputs", "versions", "device_type", "threads", "loop", "model", "optimizer",
        "schedule", "rng")  # fmt: skip
INPUTS = {  # a checkpoint's inputs, and how a changed one is named
    "data": "its data files",
    "plugins": "the plugin files",
    "torch": "torch's global state",
    "code": "the code (attn_zoo, ablations)",
}
PREDATES = (
    "the checkpoint predates per-file digests: which of the plugins' files changed is not known"
)
RNG_STATES = ("torch", "device", "python", "numpy", "batches")  # the random states kept


class ResumeError(ValueError):
    """A resume checkpoint that is not trusted: damaged, unreadable, or another cell's."""


@dataclass(frozen=True)
class ResumePlan:
    """What a worker is told about resuming a cell: take a checkpoint every `every_steps`
    steps and every `every_seconds` seconds of training (0: not on that count), and start from
    `data` (a checkpoint's bytes; None: from step 0); `sources`: the code and plugins the
    driver records for the cell's run ({"code": provenance.source_state(), "plugins":
    provenance.plugin_record(imports)}), which its checkpoints hold and must match, computed
    once per run (None: the code here, no plugins)."""

    every_steps: int = 0
    every_seconds: float = 0.0
    data: bytes | None = None
    sources: dict | None = None

    def due(self, step: int, seconds: float) -> bool:
        """Whether a checkpoint is due after `step`, `seconds` after the last one."""
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        return by_steps or 0 < self.every_seconds <= seconds


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint a worker sends the driver (ablations.run.executors), which writes it beside
    the store while its run holds the cell's claim (`ResultsStore.save_resume`)."""

    key: str
    step: int
    data: bytes


@dataclass
class LoopState:
    """What the training loop carries from one step to the next, besides the model, optimizer,
    schedule and random states: the last step done, the curve ([step, train_loss, val_loss,
    val_metric] rows), the last validation loss and metric, the best validation metric and the
    evaluations since it improved (`stale`), and the seconds trained before this process."""

    step: int = 0
    curve: list = field(default_factory=list)
    val_loss: float = float("nan")
    val_metric: float = float("nan")
    best: float = -float("inf")
    stale: int = 0
    wall_s: float = 0.0


def _config(cell: Cell) -> str:
    return json.dumps(cell.config(), sort_keys=True, default=str)


def _versions() -> dict:
    return {"torch": str(torch.__version__), "attn_zoo": attn_zoo.__version__}


def _device_rng(device: torch.device):
    """The torch module of `device`'s generator (torch.cuda, torch.mps), None on the CPU."""
    return None if device.type == "cpu" else torch.get_device_module(device.type)


def _rng_states(device: torch.device, batches: torch.Generator) -> dict:
    kind, keys, *rest = np.random.get_state()
    rng = _device_rng(device)
    return {
        "torch": torch.get_rng_state(),
        "device": None if rng is None else rng.get_rng_state(device),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), *rest),
        "batches": batches.get_state(),
    }


def _set_rng_states(states: dict, device: torch.device, batches: torch.Generator) -> None:
    torch.set_rng_state(states["torch"])
    rng = _device_rng(device)
    if rng is not None:
        rng.set_rng_state(states["device"], device)
    random.setstate(states["python"])
    kind, keys, *rest = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    batches.set_state(states["batches"])


def save_state(
    cell: Cell,
    loop: LoopState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    batches: torch.Generator,
    device: torch.device,
    inputs: dict,
) -> bytes:
    """The resume checkpoint of `cell` after step `loop.step`, trained from `inputs` (`INPUTS`:
    {"data": {path: sha256}, "plugins": {name: sha256}, "torch": torch_state(), "code":
    source_state()}) and a digest of each file of the plugins by now (`loaded_record` of the
    plugins' names, under "files"): its bytes (see the module)."""
    inputs = {**inputs, "files": loaded_record(inputs.get("plugins", {}))}
    buffer = io.BytesIO()
    torch.save(
        {
            "config": _config(cell),
            "inputs": json.dumps(inputs, sort_keys=True),
            "versions": _versions(),
            "device_type": device.type,
            "threads": torch.get_num_threads(),
            "loop": asdict(loop),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "rng": _rng_states(device, batches),
        },
        buffer,
    )
    payload = buffer.getvalue()
    return MAGIC + hashlib.sha256(payload).digest() + payload


def _changed_input(recorded: dict, inputs: dict, folder: str) -> str | None:
    """How a checkpoint's inputs (`recorded`) differ from this training's, by `INPUTS`' names:
    "its data files changed since it was written: {boards.npz: 1a2b3c4d5e6f} then,
    {boards.npz: 9f8e7d6c5b4a} now"; None if none did. Files count by content (a plugin may
    move), the plugins' file by file (`_changed_plugins`, paths shown from `folder`), torch's
    state and the code by each field ("fp32_precision cuda.matmul tf32 then, none now";
    "commit 3a5da2dc... then, 5d4b58b1... now")."""
    for what, name in INPUTS.items():
        was, now = recorded.get(what, {}), inputs.get(what, {})
        if what == "plugins":
            differ = _changed_plugins(recorded, now, folder)
            if differ:
                return f"{name} changed since it was written: {differ}"
        elif what in ("torch", "code"):
            keys = [key for key in dict.fromkeys([*was, *now]) if was.get(key) != now.get(key)]
            differ = [f"{key} {was.get(key)} then, {now.get(key)} now" for key in keys]
            if differ:
                return f"{name} changed since it was written: {'; '.join(differ)}"
        elif list(was.values()) != list(now.values()):
            then, here = short_record(was), short_record(now)
            return f"{name} changed since it was written: {then} then, {here} now"
    return None


def _names(plugins: Iterable[str]) -> list[str]:
    """The plugins a plugin record names (resolved imports, "PACKAGE (entry point)",
    ablations.run.provenance.plugin_record) as ablations.grid.plugins takes them."""
    return [name.removesuffix(" (entry point)") for name in plugins]


def loaded_record(plugins: Iterable[str]) -> dict[str, str]:
    """{path: SHA-256} of each file of the plugins named `plugins` (as a plugin record names
    them) in this process by now: their code and data, and the modules loaded from their
    folders (ablations.grid.plugins.loaded_plugin_files)."""
    return {path: file_sha256(path) for path in loaded_plugin_files(_names(plugins))}


def _changed_plugins(recorded: dict, plugins: dict, folder: str) -> str | None:
    """How the plugin files of a checkpoint's inputs (`recorded`) differ from this training's
    (`plugins`: its plugin record), file by file, each path relative to `folder` (the grid
    file's) where it lies under it: "scalecfg.py (1a2b3c4d5e6f then, 9f8e7d6c5b4a now),
    /opt/lib/helper.py (1a2b3c4d5e6f then, gone now), pkg/new.py (added)" (added: a file of
    their code now, ablations.grid.plugins.plugin_files, and not then); their record's digests
    where no file differs. A checkpoint written before a digest per file holds the plugins'
    digests and those of the files loaded from their folders ("loaded"): what differs of
    these, and that which file changed is not known. None if nothing did."""
    was = recorded.get("plugins", {})
    changed = list(was.values()) != list(plugins.values())  # the plugins' own digests
    summary = f"{short_record(was)} then, {short_record(plugins)} now"
    files = recorded.get("files", recorded.get("loaded", {}))
    differ = [_changed_file(path, digest, folder) for path, digest in files.items()]
    differ = [change for change in differ if change]
    if "files" not in recorded:  # "loaded": only the files loaded from the plugins' folders
        differ = [summary, *differ] if changed else differ
        return f"{', '.join(differ)} ({PREDATES})" if differ else None
    now = sorted({file for name in _names(plugins) for file in plugin_files(name)})
    differ += [f"{_shown(path, folder)} (added)" for path in now if path not in files]
    return ", ".join(differ or ([summary] if changed else [])) or None


def _changed_file(path: str, digest: str, folder: str) -> str | None:
    """How the file at `path` differs from SHA-256 `digest`: "helper.py (1a2b3c4d5e6f then,
    9f8e7d6c5b4a now)", "... then, gone now)" (removed or unreadable); None where it does not
    (`_shown` from `folder`)."""
    try:
        now = file_sha256(path)
    except OSError:
        now = "gone"
    return None if now == digest else f"{_shown(path, folder)} ({digest[:12]} then, {now[:12]} now)"


def _shown(path: str, folder: str) -> str:
    """`path` relative to `folder` where it lies under it ("" : none), else as it is."""
    if folder and Path(path).is_relative_to(folder):
        return str(Path(path).relative_to(folder))
    return path


def _trusted(data: bytes, cell: Cell, model: nn.Module, device: torch.device, inputs: dict) -> dict:
    """The checkpoint in `data` once every check of the module's holds; else ResumeError."""
    if not data.startswith(MAGIC):
        raise ResumeError("not an attn_zoo resume checkpoint")
    digest, payload = data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
    if hashlib.sha256(payload).digest() != digest:
        raise ResumeError("damaged: its checksum does not match its contents")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        state = {key: state[key] for key in KEYS}
        state["rng"] = {key: state["rng"][key] for key in RNG_STATES}
        state["loop"] = LoopState(**state["loop"])
        weights = {name: tuple(t.shape) for name, t in state["model"].items()}
    except Exception as err:  # a payload of another layout
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ResumeError(f"unreadable: {type(err).__name__}: {first}") from None
    if state["config"] != _config(cell):
        raise ResumeError("written for another cell config")
    recorded = json.loads(state["inputs"])
    changed = _changed_input(recorded, json.loads(json.dumps(inputs)), cell.folder)
    if changed is not None:
        raise ResumeError(changed)
    here = {"versions": _versions(), "device_type": device.type, "threads": torch.get_num_threads()}
    for what, value in here.items():
        if state[what] != value:
            raise ResumeError(f"written with {what} {state[what]}, not {value}")
    if weights != {name: tuple(t.shape) for name, t in model.state_dict().items()}:
        raise ResumeError("its weights do not fit the cell's model")
    step = state["loop"].step
    if not 1 <= step < cell.training.steps:
        raise ResumeError(f"its step {step} is not within the cell's steps")
    return state


def load_state(
    data: bytes,
    cell: Cell,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    batches: torch.Generator,
    device: torch.device,
    inputs: dict,
) -> LoopState:
    """Put `cell`'s training back where the checkpoint `data` left it: the model, optimizer,
    schedule and random states restored; its `LoopState` returned. ResumeError, before
    anything changes, for a checkpoint that is not trusted (see the module), or written from
    other `inputs` (`save_state`'s) than this training's."""
    state = _trusted(data, cell, model, device, inputs)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    _set_rng_states(state["rng"], device, batches)
    return state["loop"]
