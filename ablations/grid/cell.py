"""A cell: one training run of a grid, fully resolved, and the training settings it holds.

    cell = spec.cells[0]                  # ablations.grid.spec.load_grid expands a grid into cells
    cell.key                              # its key in the results store: a hash of its config
    cell.labels                           # {"task": ..., "size": ..., "mechanism": ...,
                                          #  "training.lr": 0.001, "seed": 0}
    training_settings(cell.training)      # every training key, defaults filled in

A cell's `training` holds the keys of `DEFAULT_TRAINING` but those in `ADDED_KEYS`, which were
added after stores existed and enter it only when set to something other than their default
(`resolve_training`): a grid that does not set them keeps every cell's key, and the cells
already in its store. This module needs no schema or validation (ablations.grid.schema and
ablations.grid.spec build cells); workers import it to train one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ablations.results.store import config_key
from ablations.tasks import Task, build_task
from ablations.tasks.registry import locate_files

# What places a cell in its grid, beside its swept keys: the task, size and mechanism labels
# and the seed (what grid.include and grid.exclude rules name).
LABEL_KEYS = ("task", "size", "mechanism", "seed")

# Every training key and its default (ablations.grid.schema.Training types and bounds them).
DEFAULT_TRAINING = {
    "steps": 500,  # or epochs: exactly one of the two
    "epochs": None,
    "batch_size": 64,
    "lr": 1e-3,
    "weight_decay": 0.01,
    "betas": [0.9, 0.999],  # AdamW's (beta1, beta2)
    "warmup_steps": 50,
    "schedule": "cosine",
    "grad_clip": 1.0,
    "eval_every": 50,
    "early_stop_target": 0.0,
    "patience": 0,
    "device": "auto",
    "precision": "float32",
    "compile": False,
    "label_smoothing": 0.0,  # of the training loss only; evaluation losses are plain
}
# Added after stores existed: in a cell's training only when set to another value than the
# default, so that the cells of a grid that does not use them keep their keys.
ADDED_KEYS = ("epochs", "patience", "device", "precision", "compile", "betas", "label_smoothing")
LENGTH = ("steps", "epochs")  # one setting: setting either replaces both


def training_settings(training: dict) -> dict:
    """A cell's `training` with every key of `DEFAULT_TRAINING`: the added keys it leaves out
    take their defaults."""
    return {**DEFAULT_TRAINING, **training}


def set_training(training: dict, key: str, value: object) -> None:
    """Set a training key; steps and epochs are one setting (setting one drops the other)."""
    if key in LENGTH:
        for length in LENGTH:
            training.pop(length, None)
    training[key] = value


def resolve_training(given: dict) -> dict:
    """A cell's training from the keys set: the keys of `DEFAULT_TRAINING` but `ADDED_KEYS`
    always (but steps where epochs are set), an added key only when it is not its default."""
    resolved = {k: v for k, v in DEFAULT_TRAINING.items() if k not in ADDED_KEYS}
    resolved.update(given)
    if "epochs" in given:
        del resolved["steps"]
    for key in ADDED_KEYS:
        if key in resolved and resolved[key] == DEFAULT_TRAINING[key]:
            del resolved[key]  # its default: keyed as a grid that does not name it
    return resolved


@dataclass(frozen=True)
class Cell:
    """One training run of the grid, fully resolved. `swept`: the swept keys the cell has
    beyond its labels and seed (no part of its config or key: their resolved values are);
    `folder`: the grid file's, where a relative data file of its task is looked up first (no
    part of its config or key either; "": the task's own data folder only)."""

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
    swept: tuple[str, ...] = ()
    folder: str = ""

    def config(self) -> dict:
        """The resolved config that keys the cell in the results store."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("swept", "folder")
        }

    def build_task(self) -> Task:
        """Its task, a relative data file looked up beside the grid file first (`locate_files`)."""
        return build_task(
            self.task_name, **locate_files(self.task_name, self.task_kwargs, self.folder)
        )

    @property
    def key(self) -> str:
        """The cell's key in the results store: a hash of its resolved config."""
        return config_key(self.config())

    def setting(self, key: str) -> object:
        """The value of a key placing the cell: a label ("task", "size", "mechanism"), the
        seed, or a swept key ("training.lr": its resolved value, the default where the cell
        does not set it; "model.pos_enc", "task_kwargs.n_train", ...: None where it does not
        set it)."""
        if key in LABEL_KEYS:
            return self.labels[key]
        section, _, name = key.partition(".")
        if section == "training":
            return training_settings(self.training).get(name)
        table = {"model": self.size, "task_kwargs": self.task_kwargs}.get(section)
        return (self.mechanism_kwargs if table is None else table).get(name)

    @property
    def labels(self) -> dict:
        """Where the cell sits in the grid: task, size and mechanism labels, the values of its
        swept keys, and the seed."""
        labels = {"task": self.task, "size": self.size["label"], "mechanism": self.mechanism}
        labels.update({key: self.setting(key) for key in self.swept})
        return {**labels, "seed": self.seed}

    def __str__(self) -> str:
        return " / ".join(str(v) for v in self.labels.values())
