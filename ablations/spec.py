"""Grid specs: a TOML file naming tasks, model sizes, mechanisms, training settings and seeds,
validated whole before anything runs, and expanded into cells.

    name = "demo"
    seeds = [0, 1, 2]                           # distinct ints in [0, 2**63); default [0]
    store = "results/demo.sqlite"               # optional; default results/<name>.sqlite;
                                                # relative to this file's folder (see below)
    checkpoints = false                         # optional; true keeps each cell's weights

    [[tasks]]
    name = "match_pattern"
    kwargs = { n_train = 2000 }
    label = "match_pattern"                     # optional (default: name); a task may appear
                                                # several times under different labels

    [[sizes]]                                   # model sizes (one is fine)
    label = "small"
    d_model = 64                                # ints >= 1; also dff (int >= 1) and
    n_layers = 2                                # dropout (float in [0, 1))

    [[mechanisms]]
    label = "relational"
    name = "relational"
    kwargs = { n_heads = 4 }

    [training]                                  # TRAINING: every key, default and range
    steps = 500                                 # or epochs = 3: exactly one of the two
    batch_size = 64
    lr = 1e-3
    patience = 0                                # evaluations without improvement; 0: off
    device = "auto"                             # "auto", "cpu", "cuda", "cuda:N", "mps"
    precision = "float32"                       # or "bf16" (autocast, CUDA and CPU)
    compile = false                             # true: torch.compile the model

    [resources]                                 # optional: what a Ray task of a cell asks for
    num_cpus = 1                                # (fractions below 1 allowed; also for GPUs)
    num_gpus = 0

    [grid]                                      # optional: non-rectangular grids
    exclude = [{ task = "match_pattern", mechanism = "standard", seed = 2 }]
    include = []                                # cells added beyond the product

A cell is one (task, size, mechanism, seed) with everything resolved; `--set key=value`
overrides (dotted keys, TOML values: ``--set training.steps=50``) apply before validation.

Validation refuses, before anything is built or written, every value that could not train:
unknown keys and names, wrong types (a bool is not an int; an int is a float), values out of
range (`TRAINING`, `SIZE_KEYS`), duplicate seeds or labels, include/exclude entries whose keys
are not axes (`AXES`) or whose labels do not exist, and a grid with no cells. Then each task
of the grid is built with its kwargs and each (mechanism, size) pair as one attention layer,
cheaply, so a bad kwarg value is refused too, blamed on the task or the mechanism it belongs
to. Every error is a one-line `SpecError` naming the file, the key, the bad value and the
valid range or choices.

Training settings resolve into each cell's `training` (which keys it in the store):

- `steps` or `epochs`, exactly one (neither: `steps` = 500). An epoch is
  ceil(n_train / batch_size) steps, n_train being the task's (its kwargs' or its default), so a
  cell of a grid with `epochs` holds `epochs` and its resolved `steps`; batches are drawn at
  random, so an epoch is as many examples as the training split has, not one pass over each.
- The keys added after stores existed (`ADDED_KEYS`: epochs, patience, device, precision,
  compile) enter a cell's `training` only when set to something other than their default:
  a grid that does not set them, or sets them to their default, keeps every cell's key, and the
  cells already in its store. Read a cell's settings with `training_settings(cell.training)`.
- `device` is refused when this machine does not have it, with the reason (`device_problem`);
  "auto" (CUDA where the worker has it, else CPU; MPS only when named) is resolved by each
  worker when it trains. `precision = "bf16"` (bfloat16 autocast; the weights and optimizer
  stay float32) runs on CUDA and on CPU (torch's CPU autocast), and is refused with "mps".
- `[resources]` is not part of any cell: it says what each cell's Ray task asks for
  (`num_cpus`, default 1, also its torch threads; `num_gpus`, default 0); a fraction below 1
  shares a device, above 1 it must be whole. The local executor places its own workers
  (one per GPU, ablations.executors.placements).

The store path (in the file or from ``--set store=...``) is a string resolved relative to the
folder of the grid file, not the working directory: a grid and its results move together and
``attn-zoo ablate run`` gives the same store from any folder. An absolute path is used as is.
"""

from __future__ import annotations

import difflib
import itertools
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ablations.store import config_key
from ablations.tasks import build_task, list_tasks, task_arguments
from attn_zoo.mechanisms.registry import MECHANISMS, list_mechanisms
from attn_zoo.models.block import build_attention


class SpecError(ValueError):
    """A grid spec that cannot run, with the file, key, value and valid choices."""


def _is(value: object, kind: type) -> bool:
    """isinstance, except that a bool is only a bool and an int is also a float."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


@dataclass(frozen=True)
class Rule:
    """What one value may be: of `kind` (see `_is`) with `ok(value)` true, `valid` saying so
    in messages; or, with `choices`, one of them."""

    kind: type
    valid: str
    ok: Callable[[object], bool] = lambda value: True
    choices: tuple = ()

    def check(self, path: Path, key: str, value: object) -> None:
        if self.choices:
            if not _is(value, self.kind) or value not in self.choices:
                raise _fail(path, key, value, self.choices)
            return
        try:
            good = _is(value, self.kind) and self.ok(value)
        except (OverflowError, TypeError):  # e.g. math.isfinite of an int beyond floats
            good = False
        if not good:
            raise SpecError(f"{path}: {key} = {value!r} must be {self.valid}")


def _int(low: int) -> Rule:
    return Rule(int, f"int >= {low}", lambda v: v >= low)


def _float(valid: str, ok: Callable[[float], bool]) -> Rule:
    return Rule(float, f"a finite float {valid}", lambda v: math.isfinite(v) and ok(v))


LABEL = Rule(str, "a non-empty str", lambda v: v != "")
# A grid name names files (results/<name>.sqlite, reports/<name>/): no path, no hidden file
NAME = Rule(
    str,
    "a file-name-safe str: letters, digits, '_', '-', '.', not starting with '.'",
    lambda v: re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", v) is not None,
)
SEED = Rule(int, "int in [0, 2**63)", lambda v: 0 <= v < 2**63)
STORE = Rule(str, "a non-empty str (a path, relative to the grid file's folder)", lambda v: v != "")
SCHEDULES = ("cosine", "constant")
PRECISIONS = ("float32", "bf16")
DEVICES = 'one of "auto", "cpu", "cuda", "cuda:N" (N an int >= 0), "mps"'


def _device_name(value: str) -> bool:
    return re.fullmatch(r"auto|cpu|cuda|cuda:\d+|mps", value) is not None


TRAINING: dict[str, tuple[object, Rule]] = {  # key: (default, what it may be)
    "steps": (500, _int(1)),
    "epochs": (None, Rule(int, "int >= 1 (an epoch: ceil(n_train / batch_size) steps)",
                          lambda v: v >= 1)),
    "batch_size": (64, _int(1)),
    "lr": (1e-3, _float("> 0", lambda v: v > 0)),
    "weight_decay": (0.01, _float(">= 0", lambda v: v >= 0)),
    "warmup_steps": (50, _int(0)),
    "schedule": ("cosine", Rule(str, "a schedule", choices=SCHEDULES)),
    "grad_clip": (1.0, _float("> 0 (the gradient-norm bound)", lambda v: v > 0)),
    "eval_every": (50, _int(1)),
    "early_stop_target": (0.0, _float("in [0, 1] (0: never stop early)", lambda v: 0 <= v <= 1)),
    "patience": (0, Rule(int, "int >= 0 (evaluations without improvement of the validation "
                              "metric before stopping; 0: never)", lambda v: v >= 0)),
    "device": ("auto", Rule(str, DEVICES, _device_name)),
    "precision": ("float32", Rule(str, "a precision", choices=PRECISIONS)),
    "compile": (False, Rule(bool, "a bool (true: train the torch.compile'd model)")),
}  # fmt: skip
# Added after stores existed: in a cell's training only when set to another value than the
# default, so that the cells of a grid that does not use them keep their keys.
ADDED_KEYS = ("epochs", "patience", "device", "precision", "compile")
# Every cell's training holds these (the defaults of a grid with an empty [training]).
TRAINING_DEFAULTS = {k: default for k, (default, _) in TRAINING.items() if k not in ADDED_KEYS}


def _resource(low_text: str, ok: Callable[[float], bool]) -> Rule:
    return _float(
        f"{low_text}: a fraction below 1 or a whole number",
        lambda v: ok(v) and (v < 1 or float(v).is_integer()),
    )


RESOURCES: dict[str, tuple[float, Rule]] = {  # [resources]: what each Ray task asks for
    "num_cpus": (1, _resource("> 0", lambda v: v > 0)),
    "num_gpus": (0, _resource(">= 0", lambda v: v >= 0)),
}
RESOURCE_DEFAULTS = {key: default for key, (default, _) in RESOURCES.items()}


def training_settings(training: dict) -> dict:
    """A cell's `training` with every key of `TRAINING`: the added keys it leaves out take
    their defaults."""
    return {**{k: default for k, (default, _) in TRAINING.items()}, **training}


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
        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
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


SIZE_KEYS = {
    "label": LABEL,
    "d_model": _int(1),
    "n_layers": _int(1),
    "dff": _int(1),
    "dropout": _float("in [0, 1)", lambda v: 0 <= v < 1),
}
TOP_LEVEL = (
    "name", "seeds", "store", "checkpoints", "tasks", "sizes", "mechanisms", "training",
    "resources", "grid",
)  # fmt: skip
TOP_LEVEL_VALUES = {"name": NAME, "store": STORE, "checkpoints": Rule(bool, "a bool")}
ENTRY_KEYS = {"tasks": ("name", "label", "kwargs"), "mechanisms": ("label", "name", "kwargs")}
REQUIRED = {"tasks": ("name",), "sizes": ("label", "d_model", "n_layers"), "mechanisms": ("name",)}
AXES = ("task", "size", "mechanism", "seed")


@dataclass(frozen=True)
class Cell:
    """One training run of the grid, fully resolved."""

    grid: str
    task: str  # its label
    task_name: str
    task_kwargs: dict
    size: dict
    mechanism: str  # its label
    mechanism_name: str
    mechanism_kwargs: dict
    training: dict
    seed: int

    def config(self) -> dict:
        """The resolved config that keys the cell in the results store."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def key(self) -> str:
        """The cell's key in the results store: a hash of its resolved config."""
        return config_key(self.config())

    @property
    def labels(self) -> dict:
        """Where the cell sits in the grid: task, size and mechanism labels, and seed."""
        return {
            "task": self.task, "size": self.size["label"], "mechanism": self.mechanism,
            "seed": self.seed,
        }  # fmt: skip

    def __str__(self) -> str:
        return " / ".join(str(v) for v in self.labels.values())


@dataclass
class GridSpec:
    path: Path
    name: str
    seeds: list[int]
    store: Path  # the store's path joined to the grid file's folder
    tasks: list[dict]
    sizes: list[dict]
    mechanisms: list[dict]
    training: dict
    exclude: list[dict] = field(default_factory=list)
    include: list[dict] = field(default_factory=list)
    checkpoints: bool = False
    resources: dict = field(default_factory=lambda: dict(RESOURCE_DEFAULTS))  # no cell's part

    def cells(self) -> list[Cell]:
        """The product of tasks x sizes x mechanisms x seeds, minus exclude, plus include."""
        cells = []
        for task, size, mech, seed in itertools.product(
            self.tasks, self.sizes, self.mechanisms, self.seeds
        ):
            labels = {
                "task": task["label"],
                "size": size["label"],
                "mechanism": mech["label"],
                "seed": seed,
            }
            if any(all(labels[k] == v for k, v in rule.items()) for rule in self.exclude):
                continue
            cells.append(self._cell(task, size, mech, seed))
        by = {
            "task": {t["label"]: t for t in self.tasks},
            "size": {s["label"]: s for s in self.sizes},
            "mechanism": {m["label"]: m for m in self.mechanisms},
        }
        for rule in self.include:
            cell = self._cell(
                by["task"][rule["task"]],
                by["size"][rule["size"]],
                by["mechanism"][rule["mechanism"]],
                rule["seed"],
            )
            if cell not in cells:
                cells.append(cell)
        return cells

    def _cell(self, task, size, mech, seed) -> Cell:
        training = dict(self.training)
        if "epochs" in training:  # steps per epoch: the task's training-set size in batches
            n_train = _task(self.path, task["label"], task["name"], task.get("kwargs", {})).n_train
            training["steps"] = training["epochs"] * math.ceil(n_train / training["batch_size"])
        return Cell(
            self.name,
            task["label"],
            task["name"],
            dict(task.get("kwargs", {})),
            dict(size),
            mech["label"],
            mech["name"],
            dict(mech.get("kwargs", {})),
            training,
            seed,
        )


def _fail(path, key, value, valid, what: str = "") -> SpecError:
    valid = [str(v) for v in valid]
    close = difflib.get_close_matches(str(value), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return SpecError(
        f"{path}: {key} = {value!r} is not valid{what}.{hint} Valid: {', '.join(valid)}"
    )


def _check_keys(path, where, table: dict, valid, what: str = "") -> None:
    for key in table:
        if key not in valid:
            raise _fail(path, f"{where}{key} (key)", key, valid, what)


def _table(path, key: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{path}: {key} = {value!r} must be a table, e.g. {{ key = value }}")
    return value


def _tables(path, key: str, value: object, empty_ok: bool = False) -> list[dict]:
    if not isinstance(value, list) or not (value or empty_ok):
        need = "a list" if empty_ok else "a non-empty list"
        raise SpecError(f"{path}: {key} = {value!r} must be {need} of tables")
    for i, item in enumerate(value):
        _table(path, f"{key}[{i}]", item)
    return value


def _one_line(err: Exception) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def apply_overrides(raw: dict, overrides: list[str], path) -> dict:
    """`key.sub=value` strings (TOML values; bare words as strings) applied to the raw spec."""
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"{path}: --set {item!r} must look like key=value")
        key, text = item.split("=", 1)
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        target = raw
        *parents, last = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise SpecError(f"{path}: --set {key}: {part!r} is not a table")
        target[last] = value
    return raw


def _check_seeds(path, seeds: object) -> list[int]:
    if not isinstance(seeds, list) or not seeds:
        raise SpecError(f"{path}: seeds = {seeds!r} must be a non-empty list of distinct ints")
    first: dict[int, int] = {}
    for i, seed in enumerate(seeds):
        SEED.check(path, f"seeds[{i}]", seed)
        if seed in first:
            raise SpecError(
                f"{path}: seeds[{i}] = {seed!r} repeats seeds[{first[seed]}]; seeds must be "
                f"distinct (got {seeds})"
            )
        first[seed] = i
    return seeds


def _check_entries(path, key: str, entries: list[dict]) -> None:
    """Keys, names, labels (defaulting to the name) and kwargs of the tasks, sizes or
    mechanisms; labels unique."""
    taken: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        _check_keys(path, f"{where}.", entry, ENTRY_KEYS.get(key, SIZE_KEYS))
        for required in REQUIRED[key]:
            if required not in entry:
                raise SpecError(f"{path}: {where} is missing {required!r}")
        if key == "sizes":
            for name, value in entry.items():
                SIZE_KEYS[name].check(path, f"{where}.{name}", value)
        else:
            names = list_tasks() if key == "tasks" else list_mechanisms()
            if not isinstance(entry["name"], str) or entry["name"] not in names:
                raise _fail(path, f"{where}.name", entry["name"], names)
            entry.setdefault("label", entry["name"])
            LABEL.check(path, f"{where}.label", entry["label"])
            kwargs = _table(path, f"{where}.kwargs", entry.get("kwargs", {}))
            if key == "tasks":
                valid = task_arguments(entry["name"])
                what = f" for task {entry['label']!r}"
            else:
                valid = MECHANISMS.kwargs(entry["name"])  # None: it takes any
                if valid is not None:  # the model fills d_model and backend in itself
                    valid = [k for k in valid if k not in ("d_model", "backend")]
                what = f" for mechanism {entry['label']!r}"
            if valid is not None:
                _check_keys(path, f"{where}.kwargs.", kwargs, valid, what)
        label = entry["label"]
        if label in taken:
            raise SpecError(
                f"{path}: {where}.label = {label!r} repeats {key}[{taken[label]}].label; "
                f"labels must be unique within {key} (a label defaults to the name)"
            )
        taken[label] = i


def _check_training(path, given: dict) -> dict:
    """The grid's training settings: the keys of `TRAINING_DEFAULTS` always, an added key
    (`ADDED_KEYS`) only when it is not its default, "steps" not when "epochs" is set (each
    cell resolves it); the device and precision refused when this machine cannot train so."""
    _check_keys(path, "training.", given, TRAINING)
    for key, value in given.items():
        TRAINING[key][1].check(path, f"training.{key}", value)
    if "epochs" in given and "steps" in given:
        raise SpecError(
            f"{path}: training.epochs = {given['epochs']!r} and training.steps = "
            f"{given['steps']!r} are both set; set exactly one of them (an epoch is "
            f"ceil(n_train / batch_size) steps)"
        )
    device = given.get("device", TRAINING["device"][0])
    problem = device_problem(device)
    if problem:
        raise SpecError(
            f"{path}: training.device = {device!r} is not available on this machine: "
            f'{problem} (valid: {DEVICES}, where available; "auto" takes CUDA where a '
            "worker has it)"
        )
    precision = given.get("precision", TRAINING["precision"][0])
    problem = precision_problem(precision, device)
    if problem:
        raise SpecError(
            f"{path}: training.precision = {precision!r} cannot be used with training.device "
            f"= {device!r}: {problem} (valid there: float32)"
        )
    training = {**TRAINING_DEFAULTS, **given}
    if "epochs" in given:
        del training["steps"]
    for key in ADDED_KEYS:
        if key in training and training[key] == TRAINING[key][0]:
            del training[key]  # its default: keyed as a grid that does not name it
    return training


def _check_resources(path, given: dict) -> dict:
    _check_keys(path, "resources.", given, RESOURCES)
    for key, value in given.items():
        RESOURCES[key][1].check(path, f"resources.{key}", value)
    return {**RESOURCE_DEFAULTS, **given}


def _check_grid_rules(path, grid: dict, valid: dict[str, list]) -> tuple[list, list]:
    """grid.exclude and grid.include: lists of tables of axes; include names every axis.
    Labels must exist; an excluded seed must be one of the seeds, an included one any seed."""
    _check_keys(path, "grid.", grid, ("exclude", "include"))
    rules = {}
    for kind in ("exclude", "include"):
        rules[kind] = _tables(path, f"grid.{kind}", grid.get(kind, []), empty_ok=True)
        for i, rule in enumerate(rules[kind]):
            where = f"grid.{kind}[{i}]"
            _check_keys(path, f"{where}.", rule, AXES)
            if kind == "include" and set(rule) != set(AXES):
                raise SpecError(f"{path}: {where} = {rule!r} must name all of {', '.join(AXES)}")
            if not rule:
                raise SpecError(
                    f"{path}: {where} = {{}} must name one or more of {', '.join(AXES)}"
                )
            for axis, value in rule.items():
                if axis == "seed":
                    SEED.check(path, f"{where}.seed", value)
                    if kind == "include":
                        continue
                if not _is(value, int if axis == "seed" else str) or value not in valid[axis]:
                    raise _fail(path, f"{where}.{axis}", value, valid[axis])
    return rules["exclude"], rules["include"]


def _task(path, label: str, name: str, kwargs: dict):
    """Task `name` built with `kwargs` (cheap: no data); SpecError blaming task `label`."""
    try:
        return build_task(name, **kwargs)
    except Exception as err:
        raise SpecError(
            f"{path}: task {label!r} (name {name!r}) cannot be built with kwargs {kwargs}: "
            f"{_one_line(err)}"
        ) from err


def _check_builds(path, cells: list[Cell]) -> None:
    """Build each task with its kwargs and each (mechanism, size) as one attention layer
    (cheap: no data, one layer), turning any exception into a SpecError blaming it."""
    tasks, layers = set(), set()
    for cell in cells:
        if cell.task not in tasks:
            tasks.add(cell.task)
            _task(path, cell.task, cell.task_name, cell.task_kwargs)
        layer = (cell.mechanism, cell.size["label"])
        if layer not in layers:
            layers.add(layer)
            try:
                with torch.random.fork_rng(devices=[]):  # leave the global RNG as it was
                    build_attention(
                        cell.mechanism_name,
                        cell.size["d_model"],
                        cell.mechanism_kwargs,
                        cell.size.get("dropout", 0.0),
                        "auto",
                    )
            except Exception as err:
                raise SpecError(
                    f"{path}: mechanism {cell.mechanism!r} (name {cell.mechanism_name!r}) cannot "
                    f"be built with kwargs {cell.mechanism_kwargs} at size "
                    f"{cell.size['label']!r} (d_model {cell.size['d_model']}): {_one_line(err)}"
                ) from err


def load_grid(path: str | Path, overrides: list[str] | None = None) -> GridSpec:
    """Read, override, validate and return the grid at `path`; raises SpecError."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise SpecError(f"{path}: cannot read the grid spec: {_one_line(err)}") from err
    raw = apply_overrides(raw, overrides or [], path)
    _check_keys(path, "", raw, TOP_LEVEL)
    for key in ("name", "tasks", "sizes", "mechanisms"):
        if key not in raw:
            raise SpecError(f"{path}: missing {key!r}")
    for key, rule in TOP_LEVEL_VALUES.items():
        if key in raw:
            rule.check(path, key, raw[key])
    seeds = _check_seeds(path, raw.get("seeds", [0]))
    for key in ("tasks", "sizes", "mechanisms"):
        _check_entries(path, key, _tables(path, key, raw[key]))
    training = _check_training(path, _table(path, "training", raw.get("training", {})))
    resources = _check_resources(path, _table(path, "resources", raw.get("resources", {})))
    valid = {
        "task": [t["label"] for t in raw["tasks"]],
        "size": [s["label"] for s in raw["sizes"]],
        "mechanism": [m["label"] for m in raw["mechanisms"]],
        "seed": seeds,
    }
    exclude, include = _check_grid_rules(path, _table(path, "grid", raw.get("grid", {})), valid)
    spec = GridSpec(
        path,
        raw["name"],
        seeds,
        Path(os.path.normpath(path.parent / raw.get("store", f"results/{raw['name']}.sqlite"))),
        raw["tasks"],
        raw["sizes"],
        raw["mechanisms"],
        training,
        exclude,
        include,
        raw.get("checkpoints", False),
        resources,
    )
    cells = spec.cells()
    if not cells:
        shape = " x ".join(str(len(v)) for v in valid.values())
        raise SpecError(
            f"{path}: grid.exclude = {exclude!r} leaves no cell of the {shape} "
            f"(tasks x sizes x mechanisms x seeds) and grid.include adds none; a grid needs at "
            f"least one cell"
        )
    _check_builds(path, cells)
    return spec
