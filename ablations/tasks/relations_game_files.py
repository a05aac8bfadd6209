"""DeepMind's relations-game boards (Shanahan et al. 2020), read from their .npz files.

The files (format below) hold rendered 36 x 36 RGB boards, a 3 x 3 grid of 12-pixel cells,
and a yes/no label per board. The repository ships two downsampled files of the "between"
game (ablations/data/relations_game/: 5,000 hexomino and 5,000 stripes boards, Apache 2.0);
the full datasets have the same format and any path can be given.

    task = build_task("relations_game_files", n_train=500)        # the shipped files
    data = task.splits(seed=0)   # train, validation, test = test_id (held-out boards of the
                                 # train file), test_ood (every board of `ood_file`)

Format (NumPy .npz): ``images`` (n, 36, 36, 3) integers 0-255 (RGB), ``labels`` (n, 1) in
{0, 1}, ``tasks`` (n, 1) the game of each board in a multi-game file (`game` keeps one; -1:
all). Inputs are float32 (n, 3, 36, 36) in [0, 1] (`images / 255`), targets the labels.

Splits, deterministic in the seed: the boards of `train_file` (of game `game`) are shuffled
once by the seed, then cut into `n_train` training, `n_validation` validation and `n_test`
held-out test boards ("test" and "test_id": in distribution); "test_ood" is every board of
`ood_file` (out of distribution), "" for none. A vision model with ``patch_size = 12`` sees one
cell per patch, as in relational_games.py (our renderer of the same games).

Files: an absolute path is read as is; a relative one, in a grid, beside the grid file when
there is one there, else in the shipped folder (never the working directory). A file is
refused by name before its arrays are read when it is no .npz archive or its arrays' headers
claim more than `memory_limit()`.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ablations.files import file_state

from .registry import Split, Task, _gib, memory_limit, register_task

DATA = Path(__file__).resolve().parents[1] / "data" / "relations_game"
FIELDS = ("images", "labels", "tasks")
HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def resolve(path: str) -> Path:
    """`path` as given when absolute, else in the shipped data folder (a grid's cells look a
    relative path up beside the grid file first: ablations.tasks.registry.locate_files)."""
    given = Path(path).expanduser()
    return given if given.is_absolute() else DATA / given


def _array_bytes(archive: zipfile.ZipFile, field: str) -> int:
    """The bytes array `field` of an .npz archive takes, from its .npy header alone;
    ValueError when the archive holds fewer."""
    member = archive.getinfo(f"{field}.npy" if f"{field}.npy" in archive.namelist() else field)
    with archive.open(member) as file:
        version = np.lib.format.read_magic(file)
        if version not in HEADERS:
            raise ValueError(f"{field}: .npy format version {version} (1.0 or 2.0 are read)")
        shape, _, dtype = HEADERS[version](file)
        if dtype.hasobject:
            raise ValueError(f"{field}: {dtype} arrays hold pickled objects, which are not read")
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if need > member.file_size - file.tell():
            raise ValueError(
                f"{field}: its header claims {shape} {dtype} ({need:,} bytes), the archive "
                f"holds {member.file_size - file.tell():,}"
            )
    return need


def load_boards(path: Path, game: int) -> tuple[Tensor, Tensor]:
    """The boards of `path` (of game `game`; -1: all): uint8 images (n, 3, H, W) and int64
    labels (n,), read once per content of the file (ablations.files.file_state); ValueError
    naming the file and what is wrong with it, before reading its arrays when it is no .npz
    archive or they would take more than `memory_limit()`."""
    return _load_boards(path, game, file_state(path) if path.is_file() else None)


@cache
def _load_boards(path: Path, game: int, state: tuple | None) -> tuple[Tensor, Tensor]:
    if state is None:
        looked = path.is_relative_to(DATA)  # a relative path: say where it was looked up
        raise ValueError(f"{path}: no such file" + (
            f" (a relative path is looked up beside the grid file, then in {DATA})" if looked
            else ""
        ))  # fmt: skip
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not an .npz file (a NumPy zip archive of .npy arrays)")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [f for f in FIELDS if f not in data.files]
            if missing:
                raise ValueError(f"lacks the fields {missing} (it has {data.files})")
            need = sum(_array_bytes(data.zip, f) for f in FIELDS)
            arrays = [np.asarray(data[f]) for f in FIELDS] if need <= memory_limit() else None
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: not a relations-game .npz file: {err}") from None
    if arrays is None:
        raise ValueError(
            f"{path}: its arrays would take {_gib(need)} (as their headers say); the limit is "
            f"{_gib(memory_limit())} (half of this machine's memory)"
        )
    images, labels, games = arrays
    n = len(images) if images.ndim else 0  # a 0-d array has no length: refused below
    if images.ndim != 4 or images.shape[3] != 3 or labels.shape != (n, 1) or games.shape != (n, 1):
        raise ValueError(
            f"{path}: images {images.shape}, labels {labels.shape}, tasks {games.shape}; want "
            "images (n, H, W, 3), labels (n, 1), tasks (n, 1)"
        )
    if images.size == 0:
        raise ValueError(f"{path}: holds no boards (images {images.shape})")
    if not np.issubdtype(images.dtype, np.integer) or images.min() < 0 or images.max() > 255:
        raise ValueError(f"{path}: images must be integers in [0, 255] ({images.dtype})")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError(f"{path}: labels must be 0 or 1")
    keep = np.ones(n, dtype=bool) if game < 0 else games[:, 0] == game
    if not keep.any():
        raise ValueError(
            f"{path}: no board of game {game} (games: {sorted(set(games[:, 0].tolist()))})"
        )
    pixels = torch.from_numpy(images[keep].astype(np.uint8)).permute(0, 3, 1, 2).contiguous()
    return pixels, torch.from_numpy(labels[keep, 0].astype(np.int64))


@register_task("relations_game_files")
@dataclass(frozen=True)
class RelationsGameFiles(Task):
    kind: ClassVar[str] = "image_classification"
    num_classes: ClassVar[int] = 2
    patch_size: ClassVar[int] = 12
    data_kwargs: ClassVar[tuple[str, ...]] = ("train_file", "ood_file")
    train_file: str = "mini_between_hexos.npz"
    ood_file: str = "mini_between_stripes.npz"
    game: int = -1
    n_train: int = 1000
    n_validation: int = 500
    n_test: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.game < -1:
            raise ValueError(f"game must be -1 (every board) or a game id >= 0, got {self.game}")
        pixels, _ = load_boards(resolve(self.train_file), self.game)
        wanted = self.n_train + self.n_validation + self.n_test
        if wanted > len(pixels):
            raise ValueError(
                f"n_train + n_validation + n_test = {wanted} but {self.train_file} has "
                f"{len(pixels)} boards" + (f" of game {self.game}" if self.game >= 0 else "")
            )
        if self.ood_file:
            load_boards(resolve(self.ood_file), self.game)

    def data_files(self) -> list[Path]:
        """The train file, and the ood file where there is one."""
        return [resolve(f) for f in (self.train_file, self.ood_file) if f]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(load_boards(resolve(self.train_file), self.game)[0].shape[1:])

    @property
    def total_examples(self) -> int:
        ood = len(load_boards(resolve(self.ood_file), self.game)[0]) if self.ood_file else 0
        return self.n_train + self.n_validation + 2 * self.n_test + ood

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """`n` boards of the train file drawn with `generator` (with replacement)."""
        pixels, labels = load_boards(resolve(self.train_file), self.game)
        pick = torch.randint(len(pixels), (n,), generator=generator)
        return pixels[pick].float() / 255, labels[pick]

    def splits(self, seed: int) -> dict[str, Split]:
        """Train, validation, test (= test_id) from the train file, shuffled by `seed`, and
        test_ood: every board of `ood_file`."""
        self.check_size()
        pixels, labels = load_boards(resolve(self.train_file), self.game)
        order = torch.randperm(len(pixels), generator=torch.Generator().manual_seed(seed))
        cuts = np.cumsum([0, self.n_train, self.n_validation, self.n_test])
        parts = {
            name: order[cuts[i] : cuts[i + 1]]
            for i, name in enumerate(("train", "validation", "test"))
        }
        splits = {name: Split(pixels[i].float() / 255, labels[i]) for name, i in parts.items()}
        splits["test_id"] = splits["test"]
        if self.ood_file:
            ood_pixels, ood_labels = load_boards(resolve(self.ood_file), self.game)
            splits["test_ood"] = Split(ood_pixels.float() / 255, ood_labels)
        return splits
