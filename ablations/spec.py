"""Grid specs: a TOML file naming tasks, model sizes, mechanisms, training settings and seeds,
validated whole before anything runs, and expanded into cells.

    name = "demo"
    seeds = [0, 1, 2]
    store = "results/demo.sqlite"              # optional; default results/<name>.sqlite
    checkpoints = false                         # optional; true keeps each cell's weights

    [[tasks]]
    name = "match_pattern"
    kwargs = { n_train = 2000 }
    label = "match_pattern"                     # optional (default: name); a task may appear
                                                # several times under different labels

    [[sizes]]                                   # model sizes (one is fine)
    label = "small"
    d_model = 64
    n_layers = 2

    [[mechanisms]]
    label = "relational"
    name = "relational"
    kwargs = { n_heads = 4 }

    [training]
    steps = 500
    batch_size = 64
    lr = 1e-3

    [grid]                                      # optional: non-rectangular grids
    exclude = [{ task = "match_pattern", mechanism = "standard", seed = 2 }]
    include = []                                # cells added beyond the product

A cell is one (task, size, mechanism, seed) with everything resolved; `--set key=value`
overrides (dotted keys, TOML values: ``--set training.steps=50``) apply before validation.
Every error names the file, the key, the bad value and the valid choices.
"""

from __future__ import annotations

import difflib
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ablations.tasks import list_tasks, task_arguments
from attn_zoo.mechanisms.registry import list_mechanisms, mechanism_kwargs

TRAINING_DEFAULTS = {
    "steps": 500,
    "batch_size": 64,
    "lr": 1e-3,
    "weight_decay": 0.01,
    "warmup_steps": 50,
    "schedule": "cosine",
    "grad_clip": 1.0,
    "eval_every": 50,
    "early_stop_target": 0.0,
}
SCHEDULES = ("cosine", "constant")
TOP_LEVEL = (
    "name", "seeds", "store", "checkpoints", "tasks", "sizes", "mechanisms", "training", "grid"
)  # fmt: skip
SIZE_KEYS = {"label": str, "d_model": int, "n_layers": int, "dff": int, "dropout": float}
AXES = ("task", "size", "mechanism", "seed")


class SpecError(ValueError):
    """A grid spec that cannot run, with the file, key, value and valid choices."""


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
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class GridSpec:
    path: Path
    name: str
    seeds: list[int]
    store: Path
    tasks: list[dict]
    sizes: list[dict]
    mechanisms: list[dict]
    training: dict
    exclude: list[dict] = field(default_factory=list)
    include: list[dict] = field(default_factory=list)
    checkpoints: bool = False

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
        return Cell(
            self.name,
            task["label"],
            task["name"],
            dict(task.get("kwargs", {})),
            dict(size),
            mech["label"],
            mech["name"],
            dict(mech.get("kwargs", {})),
            dict(self.training),
            seed,
        )


def _fail(path, key, value, valid) -> SpecError:
    valid = [str(v) for v in valid]
    close = difflib.get_close_matches(str(value), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return SpecError(f"{path}: {key} = {value!r} is not valid.{hint} Valid: {', '.join(valid)}")


def _check_type(path, key, value, kind) -> None:
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise SpecError(f"{path}: {key} = {value!r} must be {kind.__name__}")


def _check_keys(path, where, table: dict, valid) -> None:
    for key in table:
        if key not in valid:
            raise _fail(path, f"{where}{key} (key)", key, valid)


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


def load_grid(path: str | Path, overrides: list[str] | None = None) -> GridSpec:
    """Read, override, validate and return the grid at `path`; raises SpecError."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise SpecError(f"{path}: cannot read the grid spec: {err}") from err
    raw = apply_overrides(raw, overrides or [], path)
    _check_keys(path, "", raw, TOP_LEVEL)
    for key in ("name", "tasks", "sizes", "mechanisms"):
        if key not in raw:
            raise SpecError(f"{path}: missing {key!r}")
    _check_type(path, "name", raw["name"], str)
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds:
        raise SpecError(f"{path}: seeds = {seeds!r} must be a non-empty list of integers")
    for seed in seeds:
        _check_type(path, "seeds[]", seed, int)

    tasks = raw["tasks"]
    for i, task in enumerate(tasks):
        _check_keys(path, f"tasks[{i}].", task, ("name", "label", "kwargs"))
        if task.get("name") not in list_tasks():
            raise _fail(path, f"tasks[{i}].name", task.get("name"), list_tasks())
        task.setdefault("label", task["name"])
        _check_keys(
            path, f"tasks[{i}].kwargs.", task.get("kwargs", {}), task_arguments(task["name"])
        )

    for i, size in enumerate(raw["sizes"]):
        _check_keys(path, f"sizes[{i}].", size, SIZE_KEYS)
        for key in ("label", "d_model", "n_layers"):
            if key not in size:
                raise SpecError(f"{path}: sizes[{i}] is missing {key!r}")
        for key, value in size.items():
            _check_type(path, f"sizes[{i}].{key}", value, SIZE_KEYS[key])

    for i, mech in enumerate(raw["mechanisms"]):
        _check_keys(path, f"mechanisms[{i}].", mech, ("label", "name", "kwargs"))
        if mech.get("name") not in list_mechanisms():
            raise _fail(path, f"mechanisms[{i}].name", mech.get("name"), list_mechanisms())
        mech.setdefault("label", mech["name"])
        valid = [k for k in mechanism_kwargs(mech["name"]) if k not in ("d_model", "backend")]
        _check_keys(path, f"mechanisms[{i}].kwargs.", mech.get("kwargs", {}), valid)
    for kind, items, label in (
        ("tasks", tasks, "label"),
        ("sizes", raw["sizes"], "label"),
        ("mechanisms", raw["mechanisms"], "label"),
    ):
        labels = [item[label] for item in items]
        if len(set(labels)) != len(labels):
            raise SpecError(f"{path}: {kind} {label}s must be unique, got {labels}")

    training = dict(TRAINING_DEFAULTS)
    _check_keys(path, "training.", raw.get("training", {}), TRAINING_DEFAULTS)
    for key, value in raw.get("training", {}).items():
        _check_type(path, f"training.{key}", value, type(TRAINING_DEFAULTS[key]))
        training[key] = value
    if training["schedule"] not in SCHEDULES:
        raise _fail(path, "training.schedule", training["schedule"], SCHEDULES)

    grid = raw.get("grid", {})
    _check_keys(path, "grid.", grid, ("exclude", "include"))
    valid_values = {
        "task": [t["label"] for t in tasks],
        "size": [s["label"] for s in raw["sizes"]],
        "mechanism": [m["label"] for m in raw["mechanisms"]],
        "seed": seeds,
    }
    for kind in ("exclude", "include"):
        for i, rule in enumerate(grid.get(kind, [])):
            _check_keys(path, f"grid.{kind}[{i}].", rule, AXES)
            if kind == "include" and set(rule) != set(AXES):
                raise SpecError(
                    f"{path}: grid.include[{i}] must name all of {AXES}, got {sorted(rule)}"
                )
            for axis, value in rule.items():
                if kind == "exclude" and value not in valid_values[axis]:
                    raise _fail(path, f"grid.{kind}[{i}].{axis}", value, valid_values[axis])
                if kind == "include" and axis != "seed" and value not in valid_values[axis]:
                    raise _fail(path, f"grid.{kind}[{i}].{axis}", value, valid_values[axis])
    store = Path(raw.get("store", f"results/{raw['name']}.sqlite"))
    checkpoints = raw.get("checkpoints", False)
    _check_type(path, "checkpoints", checkpoints, bool)
    return GridSpec(
        path,
        raw["name"],
        seeds,
        store,
        tasks,
        raw["sizes"],
        raw["mechanisms"],
        training,
        grid.get("exclude", []),
        grid.get("include", []),
        checkpoints,
    )
