"""The task registry and the small API every synthetic task follows.

A task is a frozen dataclass registered under a name::

    @register_task("same_pair")
    @dataclass(frozen=True)
    class SamePair(Task):
        kind: ClassVar[str] = "classification"
        ...
        def generate(self, n, generator): ...  # -> (inputs, targets)

    task = build_task("same_pair", vocab_size=32, n_train=1000)
    data = task.splits(seed=0)  # {"train": Split, "validation": Split, "test": Split}

A task exposes `kind` (one of `KINDS`), `vocab_size`, `seq_len` (the input length; image tasks
give `image_shape` instead), `num_classes` where relevant, and `splits(seed)`. Everything is
generated offline by vectorised torch code from one `torch.Generator` seeded with `seed`, so the
same seed gives the same tensors on every machine and run.

A task may give more test splits, named "test_<what>" (relational_games: "test_id" and
"test_ood"); training evaluates each into metrics "test_<what>_acc", "test_<what>_loss".

A task that reads files names the kwargs holding their paths in `data_kwargs` and returns the
files it reads from `data_files()` (each cell records their SHA-256: ablations.run.provenance). A
relative path is looked up beside the grid file first (`locate_files`: the spec knows that
folder), then in the task's own data folder; never in the working directory.

Targets: classification tasks give one class id per example, shape ``(n,)``; language-model
tasks give one next-token target per input position, shape ``(n, seq_len)``, with
`IGNORE_INDEX` (-1) where a position is not scored (use ``cross_entropy(ignore_index=-1)``).

Image-classification tasks give float32 ``inputs`` of shape ``(n, *image_shape)`` in [0, 1],
``image_shape = (channels, height, width)``, and a `patch_size` for a vision model.

Seq2seq tasks share one vocabulary of `vocab_size` tokens between source and target and expose
`seq_len`, `target_len`, `start_token` and `pad_token`. ``inputs`` ``(n, seq_len)`` are the
source tokens padded with `pad_token`; ``targets`` ``(n, target_len)`` are `start_token`, the
answer tokens, an end token, then `IGNORE_INDEX` padding. Teacher forcing: the decoder reads
``targets[:, :-1]`` with `IGNORE_INDEX` replaced by `pad_token` and is scored on
``targets[:, 1:]`` with ``ignore_index=-1``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar, TypeVar

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.data import Dataset

from attn_zoo.registry import Registry

KINDS = ("classification", "language_model", "seq2seq", "image_classification")
IGNORE_INDEX = -1
SPLIT_SIZES = ("n_train", "n_validation", "n_test")
# The largest value of any other int setting of a task (vocab_size, lengths, dimensions): it
# keeps the generation of one example, which measures what a split needs, small.
MAX_SETTING = 2**16
TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}
ARTICLES = {"int": "an int", "float": "a float", "str": "a str", "bool": "a bool"}


def memory_limit() -> int:
    """The bytes a task's data may take: half of this machine's memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n < 2**50 else f"{n / 2**40:,.3g} TiB"


class _Allocations(TorchFunctionMode):
    """Counts the bytes of every tensor storage the torch functions and tensor methods run
    under it create. A function mode, not a dispatch mode: entering a dispatch mode imports
    torch._dynamo, 2.7 s of every process that loads a grid (a worker's, `ablate status`)."""

    def __init__(self):
        super().__init__()
        self.bytes, self.seen = 0, set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, Tensor) and t.untyped_storage().data_ptr() not in self.seen:
                self.seen.add(t.untyped_storage().data_ptr())
                self.bytes += t.untyped_storage().nbytes()
        return out


@dataclass(frozen=True)
class Split(Dataset):
    """One split: `inputs[i]` and `targets[i]` form example i."""

    inputs: Tensor
    targets: Tensor

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.targets):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.targets)} targets")

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.inputs[i], self.targets[i]


@dataclass(frozen=True)
class Task:
    """Base of every task: split sizes, `splits(seed)`, and the contract `generate` fulfils."""

    kind: ClassVar[str]
    num_classes: ClassVar[int | None] = None
    data_kwargs: ClassVar[tuple[str, ...]] = ()  # the kwargs naming the files it reads
    n_train: int = 2000
    n_validation: int = 500
    n_test: int = 500

    def __post_init__(self) -> None:
        """Every setting of its annotated type (an int is no bool and no float; a float is
        finite), split sizes >= 1, other ints <= `MAX_SETTING`; each task checks its own
        ranges after this."""
        for f in fields(self):
            value, kinds = getattr(self, f.name), TYPES.get(str(f.type), (object,))
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                what = ARTICLES.get(str(f.type), str(f.type))
                raise ValueError(f"{f.name}={value!r} must be {what} (got {type(value).__name__})")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name}={value!r} must be a finite float")
        for f in SPLIT_SIZES:
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in SPLIT_SIZES and type(value) is int and value > MAX_SETTING:
                raise ValueError(f"{f.name}={value} must be <= {MAX_SETTING}")

    def data_files(self) -> list[Path]:
        """The files its data is read from, resolved; none for a generated task."""
        return []

    @property
    def total_examples(self) -> int:
        """Examples in all its splits."""
        return self.n_train + self.n_validation + self.n_test

    def data_bytes(self) -> int:
        """About the most bytes generating and keeping its splits takes, from what generating
        1 and 9 examples allocates after a first example (every tensor storage created,
        intermediates included): one example's bytes, and the per-example growth times the
        other `total_examples`."""
        self.generate(1, torch.Generator().manual_seed(0))  # caches (tiles, grammars) filled
        allocated = []
        for n in (1, 9):
            with _Allocations() as allocations:
                self.generate(n, torch.Generator().manual_seed(0))
            allocated.append(allocations.bytes)
        per_example = max(allocated[1] - allocated[0], 0) / 8
        return int(allocated[0] + per_example * (self.total_examples - 1))

    def check_size(self) -> None:
        """ValueError when its data would not fit `memory_limit()`, naming the limit."""
        need, limit = self.data_bytes(), memory_limit()
        if need > limit:
            sizes = ", ".join(f"{f}={getattr(self, f):,}" for f in SPLIT_SIZES)
            raise ValueError(
                f"{type(self).__name__} with {sizes} needs about {_gib(need)} for its data; the "
                f"limit is {_gib(limit)} (half of this machine's memory): use smaller splits"
            )

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """`n` examples drawn with `generator`: ``(inputs, targets)``."""
        raise NotImplementedError

    def loss_floors(self, splits: dict[str, Split]) -> dict[str, float]:
        """The lowest mean loss any model can have on the validation and test `splits`, for a
        task that knows it (`best_losses`, e.g. the grammar's true probabilities): metrics
        ``loss_floor_validation`` and ``loss_floor_test``, recorded with each cell that
        finishes (reports draw them); {} for a task without one."""
        best_losses = getattr(self, "best_losses", None)
        if best_losses is None:
            return {}
        return {
            f"loss_floor_{split}": float(best_losses(*splits[split][:]).mean())
            for split in ("validation", "test")
        }

    def splits(self, seed: int) -> dict[str, Split]:
        """Train, validation and test splits, deterministic in `seed` (`check_size` first)."""
        self.check_size()
        generator = torch.Generator().manual_seed(seed)
        sizes = {"train": self.n_train, "validation": self.n_validation, "test": self.n_test}
        return {name: Split(*self.generate(n, generator)) for name, n in sizes.items()}


def balanced_labels(n: int, num_classes: int, generator: torch.Generator) -> Tensor:
    """`n` class ids in random order, each class appearing n // num_classes times (+1 for some)."""
    return (torch.arange(n) % num_classes)[torch.randperm(n, generator=generator)]


def distinct_tokens(n: int, k: int, vocab_size: int, generator: torch.Generator) -> Tensor:
    """`(n, k)` token ids, distinct within each row, uniform over ``[0, vocab_size)``."""
    return torch.rand(n, vocab_size, generator=generator).argsort(dim=1)[:, :k]


T = TypeVar("T", bound=type[Task])
TASKS: Registry[type[Task]] = Registry("task", base=Task)


def register_task(name: str, replace: bool = False) -> Callable[[T], T]:
    """Class decorator: make a `Task` dataclass buildable as `build_task(name, ...)`. A taken
    name is refused unless `replace`, which is recorded (`attn_zoo.registry.replaced_names`)."""

    def decorate(cls: T) -> T:
        if getattr(cls, "kind", None) not in KINDS:
            kind = getattr(cls, "kind", None)
            raise ValueError(f"task {name!r} has kind {kind!r}; valid: {', '.join(KINDS)}")
        return TASKS.register(name, cls, replace=replace)

    return decorate


def list_tasks() -> list[str]:
    """Names of the registered tasks, sorted."""
    return TASKS.names()


def task_arguments(name: str) -> list[str]:
    """The keyword arguments `build_task(name, ...)` accepts."""
    return TASKS.kwargs(name) or []


def build_task(name: str, **kwargs: object) -> Task:
    """The task `name` with `kwargs` overriding its defaults; ValueError on a bad name or kwarg."""
    return TASKS.build(name, **kwargs)


def locate_files(name: str, kwargs: Mapping[str, object], folder: str | Path | None) -> dict:
    """`kwargs` of task `name` with each relative path of its `data_kwargs` that names a file
    in `folder` (a grid file's; None or "": none) replaced by that file's absolute path; the
    task looks the other relative paths up in its own data folder. A cell's key keeps the path
    as given."""
    data_kwargs = TASKS[name].data_kwargs if folder and name in TASKS else ()
    located = dict(kwargs)
    for key in data_kwargs:
        value = kwargs.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            beside = Path(folder) / value
            if beside.is_file():
                located[key] = str(beside.resolve())
    return located
