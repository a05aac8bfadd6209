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

    [training]                                  # class Training: every key, default, range
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

The file's schema is typed: `GridFile` and its tables (`TaskEntry`, `SizeEntry`,
`MechanismEntry`, `Training`, `Resources`, `GridRules`) are strict pydantic models whose fields
carry their type, default and range (`Valid`, shown in messages). Validation refuses, before
anything is built or written, every value that could not train: unknown keys and names, wrong
types (a bool is not an int; an int is a float), values out of range, duplicate seeds or
labels, include/exclude entries whose keys are not axes (`AXES`) or whose labels do not exist,
and a grid with no cells. Then each task
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
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import torch
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

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


@dataclass(frozen=True)
class Valid:
    """What a field of the spec may be, as its error messages say: `text` ("int >= 1"), or
    one of `choices` (a tuple, or a function giving them, e.g. the registered task names)."""

    text: str = ""
    choices: tuple | Callable[[], list[str]] = ()

    def options(self) -> list[str]:
        return list(self.choices() if callable(self.choices) else self.choices)


def _checked(ok: Callable[[object], bool]) -> AfterValidator:
    def check(value):
        try:
            good = ok(value)
        except (OverflowError, TypeError):  # e.g. math.isfinite of an int beyond floats
            good = False
        if not good:
            raise ValueError("out of range")
        return value

    return AfterValidator(check)


# Strict: a bool is not an int, "16" not an int, 2.0 not an int; a float field takes an int as
# given (it keys a cell as the file wrote it).
Number = StrictInt | StrictFloat


def rule(kind: object, valid: str, ok: Callable[[object], bool] = lambda value: True) -> object:
    """A field type: `kind` with `ok(value)` true; `valid` says what it may be in messages."""
    return Annotated[kind, _checked(ok), Valid(valid)]


def choice(choices: tuple | Callable[[], list[str]]) -> object:
    """A field type: a str, one of `choices` (a tuple, or a function giving them)."""
    valid = Valid(choices=choices)
    return Annotated[StrictStr, _checked(lambda v: v in valid.options()), valid]


def whole(low: int, valid: str = "") -> object:
    return rule(StrictInt, valid or f"int >= {low}", lambda v: v >= low)


def finite(valid: str, ok: Callable[[float], bool]) -> object:
    return rule(Number, f"a finite float {valid}", lambda v: math.isfinite(v) and ok(v))


def resource(valid: str, ok: Callable[[float], bool]) -> object:
    return finite(
        f"{valid}: a fraction below 1 or a whole number",
        lambda v: ok(v) and (v < 1 or float(v).is_integer()),
    )


Label = rule(StrictStr, "a non-empty str", lambda v: v != "")
# A grid name names files (results/<name>.sqlite, reports/<name>/): no path, no hidden file
Name = rule(
    StrictStr,
    "a file-name-safe str: letters, digits, '_', '-', '.', not starting with '.'",
    lambda v: re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", v) is not None,
)
SEED_RANGE = "int in [0, 2**63)"
Seed = rule(StrictInt, SEED_RANGE, lambda v: 0 <= v < 2**63)
Kwargs = Annotated[dict[str, Any], Valid("a table, e.g. { key = value }")]
SCHEDULES = ("cosine", "constant")
PRECISIONS = ("float32", "bf16")
DEVICES = 'one of "auto", "cpu", "cuda", "cuda:N" (N an int >= 0), "mps"'


def _device_name(value: str) -> bool:
    return re.fullmatch(r"auto|cpu|cuda|cuda:\d+|mps", value) is not None


def tables(entry: type, valid: str = "a non-empty list of tables", min_length: int = 1) -> object:
    return Annotated[list[entry], Field(min_length=min_length), Valid(valid)]


class Table(BaseModel):
    """A table of the grid file: its keys typed, no other key."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TaskEntry(Table):
    """A [[tasks]] entry: a registered task, its kwargs, its label (default: the name)."""

    name: choice(list_tasks)
    label: Label | None = None
    kwargs: Kwargs = {}


class SizeEntry(Table):
    """A [[sizes]] entry: a model size."""

    label: Label
    d_model: whole(1)
    n_layers: whole(1)
    dff: whole(1) | None = None
    dropout: finite("in [0, 1)", lambda v: 0 <= v < 1) = 0.0


class MechanismEntry(Table):
    """A [[mechanisms]] entry: a registered mechanism, its kwargs (the model fills d_model and
    backend), its label (default: the name)."""

    name: choice(list_mechanisms)
    label: Label | None = None
    kwargs: Kwargs = {}


class Training(Table):
    """[training]: every key with its default and range."""

    steps: whole(1) = 500  # or epochs: exactly one of the two
    epochs: whole(1, "int >= 1 (an epoch: ceil(n_train / batch_size) steps)") | None = None
    batch_size: whole(1) = 64
    lr: finite("> 0", lambda v: v > 0) = 1e-3
    weight_decay: finite(">= 0", lambda v: v >= 0) = 0.01
    warmup_steps: whole(0) = 50
    schedule: choice(SCHEDULES) = "cosine"
    grad_clip: finite("> 0 (the gradient-norm bound)", lambda v: v > 0) = 1.0
    eval_every: whole(1) = 50
    early_stop_target: finite("in [0, 1] (0: never stop early)", lambda v: 0 <= v <= 1) = 0.0
    patience: whole(
        0,
        "int >= 0 (evaluations without improvement of the validation metric before "
        "stopping; 0: never)",
    ) = 0
    device: rule(StrictStr, DEVICES, _device_name) = "auto"
    precision: choice(PRECISIONS) = "float32"
    compile: rule(StrictBool, "a bool (true: train the torch.compile'd model)") = False


class Resources(Table):
    """[resources]: what each Ray task of a cell asks for (no part of any cell)."""

    num_cpus: resource("> 0", lambda v: v > 0) = 1
    num_gpus: resource(">= 0", lambda v: v >= 0) = 0


class GridRules(Table):
    """[grid]: cells taken out of the product and cells added to it (checked against the
    grid's labels and seeds by `load_grid`)."""

    exclude: tables(Kwargs, "a list of tables", 0) = []
    include: tables(Kwargs, "a list of tables", 0) = []


class GridFile(Table):
    """A grid file as written: the typed schema `load_grid` validates it with."""

    name: Name
    seeds: tables(Seed, f"a non-empty list of distinct ints ({SEED_RANGE})") = [0]
    store: (
        rule(StrictStr, "a non-empty str (a path, relative to the grid file's folder)", bool) | None
    ) = None
    checkpoints: rule(StrictBool, "a bool") = False
    tasks: tables(TaskEntry)
    sizes: tables(SizeEntry)
    mechanisms: tables(MechanismEntry)
    training: Training = Training()
    resources: Resources = Resources()
    grid: GridRules = GridRules()


# Added after stores existed: in a cell's training only when set to another value than the
# default, so that the cells of a grid that does not use them keep their keys.
ADDED_KEYS = ("epochs", "patience", "device", "precision", "compile")
# Every cell's training holds these (the defaults of a grid with an empty [training]).
TRAINING_DEFAULTS = {k: v for k, v in Training().model_dump().items() if k not in ADDED_KEYS}
RESOURCE_DEFAULTS = Resources().model_dump()


def training_settings(training: dict) -> dict:
    """A cell's `training` with every key of `TRAINING`: the added keys it leaves out take
    their defaults."""
    return {**Training().model_dump(), **training}


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


def _one_line(err: Exception) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def _parts(annotation: object) -> tuple[object, list[Valid]]:
    """The type under `Annotated` and `X | None`, and the `Valid`s annotating it."""
    valids = []
    while True:
        if get_origin(annotation) is Annotated:
            annotation, *meta = get_args(annotation)
            valids += [m for m in meta if isinstance(m, Valid)]
        elif get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation, valids


def _where(loc: tuple) -> tuple[str, list[str], Valid | None]:
    """For an error's location in `GridFile`: its key as the file writes it ("tasks[0].name";
    a union member's tag left out), the keys its table may hold, and its `Valid`."""
    node, key, keys = GridFile, "", []
    for part in loc:
        base, _ = _parts(node)
        if isinstance(base, type) and issubclass(base, BaseModel) and part in base.model_fields:
            keys, node = list(base.model_fields), get_type_hints(base, include_extras=True)[part]
            key += f".{part}" if key else part
        elif isinstance(part, int) and get_origin(base) is list:
            node, key = get_args(base)[0], f"{key}[{part}]"
        elif isinstance(part, str) and get_origin(base) is dict:
            node, key = get_args(base)[1], f"{key}.{part}"
        else:  # the tag of a union member (int or float)
            break
    base, valids = _parts(node)
    if isinstance(base, type) and issubclass(base, BaseModel):
        keys = list(base.model_fields)
    return key, keys, (valids[0] if valids else None)


def _spec_error(path, err: ValidationError) -> SpecError:
    """The first error of validating the file against `GridFile`, as a one-line SpecError
    naming the key, the value and what it may be."""
    error = err.errors()[0]
    loc, value = error["loc"], error["input"]
    if error["type"] == "extra_forbidden":
        parent, keys, _ = _where(loc[:-1])
        return _fail(path, f"{parent + '.' if parent else ''}{loc[-1]} (key)", loc[-1], keys)
    if error["type"] == "missing":
        parent = _where(loc[:-1])[0]
        return SpecError(f"{path}: {parent + ' is ' if parent else ''}missing {loc[-1]!r}")
    key, _, valid = _where(loc)
    if error["type"] in ("model_type", "dict_type"):
        return SpecError(f"{path}: {key} = {value!r} must be a table, e.g. {{ key = value }}")
    if valid is not None and valid.choices:
        return _fail(path, key, value, valid.options())
    text = valid.text if valid is not None else error["msg"]
    return SpecError(f"{path}: {key} = {value!r} must be {text}")


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


def _check_seeds(path, seeds: list[int]) -> None:
    first: dict[int, int] = {}
    for i, seed in enumerate(seeds):
        if seed in first:
            raise SpecError(
                f"{path}: seeds[{i}] = {seed!r} repeats seeds[{first[seed]}]; seeds must be "
                f"distinct (got {seeds})"
            )
        first[seed] = i


def _check_entries(path, key: str, entries: list[TaskEntry | SizeEntry | MechanismEntry]) -> None:
    """Labels (defaulting to the name) unique; kwargs keys of tasks and mechanisms known."""
    taken: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if isinstance(entry, (TaskEntry, MechanismEntry)):
            entry.label = entry.label or entry.name
            if isinstance(entry, TaskEntry):
                valid = task_arguments(entry.name)
                what = f" for task {entry.label!r}"
            else:
                valid = MECHANISMS.kwargs(entry.name)  # None: it takes any
                if valid is not None:  # the model fills d_model and backend in itself
                    valid = [k for k in valid if k not in ("d_model", "backend")]
                what = f" for mechanism {entry.label!r}"
            if valid is not None:
                _check_keys(path, f"{where}.kwargs.", entry.kwargs, valid, what)
        if entry.label in taken:
            raise SpecError(
                f"{path}: {where}.label = {entry.label!r} repeats {key}[{taken[entry.label]}]"
                f".label; labels must be unique within {key} (a label defaults to the name)"
            )
        taken[entry.label] = i


def _check_training(path, training: Training) -> dict:
    """The grid's training settings: the keys of `TRAINING_DEFAULTS` always, an added key
    (`ADDED_KEYS`) only when it is not its default, "steps" not when "epochs" is set (each
    cell resolves it); the device and precision refused when this machine cannot train so."""
    given = training.model_dump(exclude_unset=True)
    if "epochs" in given and "steps" in given:
        raise SpecError(
            f"{path}: training.epochs = {given['epochs']!r} and training.steps = "
            f"{given['steps']!r} are both set; set exactly one of them (an epoch is "
            f"ceil(n_train / batch_size) steps)"
        )
    problem = device_problem(training.device)
    if problem:
        raise SpecError(
            f"{path}: training.device = {training.device!r} is not available on this machine: "
            f'{problem} (valid: {DEVICES}, where available; "auto" takes CUDA where a '
            "worker has it)"
        )
    problem = precision_problem(training.precision, training.device)
    if problem:
        raise SpecError(
            f"{path}: training.precision = {training.precision!r} cannot be used with "
            f"training.device = {training.device!r}: {problem} (valid there: float32)"
        )
    resolved = {**TRAINING_DEFAULTS, **given}
    if "epochs" in given:
        del resolved["steps"]
    defaults = Training()
    for key in ADDED_KEYS:
        if key in resolved and resolved[key] == getattr(defaults, key):
            del resolved[key]  # its default: keyed as a grid that does not name it
    return resolved


def _check_grid_rules(path, grid: GridRules, valid: dict[str, list]) -> None:
    """grid.exclude and grid.include: tables of axes; include names every axis. Labels must
    exist; an excluded seed must be one of the seeds, an included one any seed."""
    for kind in ("exclude", "include"):
        for i, rule_ in enumerate(getattr(grid, kind)):
            where = f"grid.{kind}[{i}]"
            _check_keys(path, f"{where}.", rule_, AXES)
            if kind == "include" and set(rule_) != set(AXES):
                raise SpecError(f"{path}: {where} = {rule_!r} must name all of {', '.join(AXES)}")
            if not rule_:
                raise SpecError(
                    f"{path}: {where} = {{}} must name one or more of {', '.join(AXES)}"
                )
            for axis, value in rule_.items():
                if axis == "seed":
                    try:
                        TypeAdapter(Seed).validate_python(value, strict=True)
                    except ValidationError:
                        raise SpecError(
                            f"{path}: {where}.seed = {value!r} must be {SEED_RANGE}"
                        ) from None
                    if kind == "include":
                        continue
                if isinstance(value, bool) or value not in valid[axis]:
                    raise _fail(path, f"{where}.{axis}", value, valid[axis])


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
    try:
        grid = GridFile.model_validate(raw)
    except ValidationError as err:
        raise _spec_error(path, err) from None
    _check_seeds(path, grid.seeds)
    for key in ("tasks", "sizes", "mechanisms"):
        _check_entries(path, key, getattr(grid, key))
    training = _check_training(path, grid.training)
    valid = {
        "task": [t.label for t in grid.tasks],
        "size": [s.label for s in grid.sizes],
        "mechanism": [m.label for m in grid.mechanisms],
        "seed": grid.seeds,
    }
    _check_grid_rules(path, grid.grid, valid)
    spec = GridSpec(
        path,
        grid.name,
        grid.seeds,
        Path(os.path.normpath(path.parent / (grid.store or f"results/{grid.name}.sqlite"))),
        [t.model_dump() for t in grid.tasks],
        [s.model_dump(exclude_unset=True) for s in grid.sizes],
        [m.model_dump() for m in grid.mechanisms],
        training,
        grid.grid.exclude,
        grid.grid.include,
        grid.checkpoints,
        grid.resources.model_dump(),
    )
    cells = spec.cells()
    if not cells:
        shape = " x ".join(str(len(v)) for v in valid.values())
        raise SpecError(
            f"{path}: grid.exclude = {grid.grid.exclude!r} leaves no cell of the {shape} "
            f"(tasks x sizes x mechanisms x seeds) and grid.include adds none; a grid needs at "
            f"least one cell"
        )
    _check_builds(path, cells)
    return spec
