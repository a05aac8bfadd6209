"""A cell: one training run of a grid, fully resolved, and how its settings key it.

    cell = spec.cells[0]                  # ablations.grid.spec.load_grid expands a grid into cells
    cell.key                              # its key in the results store: a hash of its config
    cell.labels                           # {"task": ..., "size": ..., "mechanism": ...,
                                          #  "training.lr": 0.001, "seed": 0}
    cell.training.lr                      # its training settings: a frozen TrainingSettings
                                          # (ablations/grid/schema.py: every key and default)

A cell's key is the hash of its config, where its training settings are written as
`keyed_training` writes them: every key but those in `ADDED_KEYS`, which were added after stores
existed and enter the key only when set to something other than their default, so that a grid
that does not set them keeps every cell's key, and the cells already in its store. Workers
import this module to train one cell.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ablations.grid.schema import TrainingSettings
from ablations.results.store import config_key
from ablations.tasks import Task, build_task
from ablations.tasks.registry import locate_files

# What places a cell in its grid, beside its swept keys: the task, size and mechanism labels
# and the seed (what grid.include and grid.exclude rules name).
LABEL_KEYS = ("task", "size", "mechanism", "seed")
# Added after stores existed: in a cell's key only when set to another value than the default,
# so that the cells of a grid that does not use them keep their keys.
ADDED_KEYS = ("epochs", "patience", "device", "precision", "compile", "betas", "label_smoothing")
LENGTH = ("steps", "epochs")  # one setting: setting either replaces both
DEFAULTS = TrainingSettings().model_dump()


def set_training(training: dict, key: str, value: object) -> None:
    """Set a training key of settings being merged (grid < size < task < mechanism < sweep);
    steps and epochs are one setting (setting one drops the other)."""
    if key in LENGTH:
        for length in LENGTH:
            training.pop(length, None)
    training[key] = value


def training_from(given: dict) -> TrainingSettings:
    """The settings of the keys `given` (validated already, or read back from a store), the
    others at their defaults; ValueError naming a key that is no training setting."""
    unknown = sorted(set(given) - set(TrainingSettings.model_fields))
    if unknown:
        raise ValueError(
            f"training keys {unknown} are not training settings; valid: "
            f"{', '.join(TrainingSettings.model_fields)}"
        )
    return TrainingSettings.model_construct(**given)


def keyed_training(training: TrainingSettings) -> dict:
    """`training` as it keys a cell: every setting, but those of `ADDED_KEYS` at their default
    (and epochs where unset)."""
    keyed = training.model_dump()
    for key in ADDED_KEYS:
        if keyed[key] == DEFAULTS[key]:
            del keyed[key]
    return keyed


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
    training: TrainingSettings
    seed: int
    swept: tuple[str, ...] = ()
    folder: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.training, dict):  # a config read back from a store or a file
            object.__setattr__(self, "training", training_from(self.training))

    def config(self) -> dict:
        """The resolved config that keys the cell in the results store (its training as
        `keyed_training` writes it)."""
        config = {f.name: getattr(self, f.name) for f in fields(self)}
        for unkeyed in ("swept", "folder"):
            del config[unkeyed]
        return {**config, "training": keyed_training(self.training)}

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
            return getattr(self.training, name, None)
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
