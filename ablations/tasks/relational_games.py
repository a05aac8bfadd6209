"""relational_games: the relational games of Shanahan et al. (2020), rendered procedurally.

A board is a 3 x 3 grid of cells, each empty or holding one object; the image is the board
drawn in RGB on black, ``cell_size`` pixels per cell, so a vision model with
``patch_size = cell_size`` sees one cell per patch. Every problem is a balanced yes/no question:

* ``same``: three objects in random cells; are two of them identical? (Negatives: three
  distinct objects.)
* ``between``: three objects fill a random row or column; do two identical objects flank the
  third (ABA)? Negatives hold the identical pair side by side (AAB or BAA).
* ``occurs``: one object in the top row, three distinct ones in the bottom row; does the top
  object occur in the bottom row?
* ``xoccurs``: three distinct objects in each of the top and bottom rows; does exactly one of
  the top objects occur in the bottom row? Negatives share none or two.
* ``row_match``: three distinct objects in the top row; is the bottom row the same objects in
  the same order? Negatives hold the same objects in another order, or one object swapped.
* ``left_of``: the target (a white square frame, outside every shape set) and one object, in
  different columns; is the target left of the object?
* ``match_pattern``: the top and bottom rows each follow one of the patterns AAA, AAB, ABA,
  ABB, ABC with fresh objects in the bottom row (as in the `match_pattern` task); do they
  follow the same pattern?

Objects come from a fixed bank built from a fixed seed: an object is a mask (a connected set of
cells of a 3 x 3 grid that spans it, drawn with a 1-pixel margin by nearest-neighbour
upscaling) in one colour. The shape sets are disjoint in both: ``train`` has 8 five-cell masks
in red, green, blue and yellow, ``heldout`` 8 six-cell masks in cyan, magenta, orange and
purple. Train and validation use ``shape_set``; test uses ``test_shape_set``, so
``test_shape_set="heldout"`` gives an out-of-distribution test split; the extra test splits
"test_id" and "test_ood" (`RelationalGames.splits`) give both, whatever `test_shape_set`.

Board ids: object ``32 s + 4 m + c`` is mask m in colour c of set s (``train`` 0, ``heldout``
1); `TARGET` (64) is the left_of target and `EMPTY` (65) an empty cell.

Literal example (problem="same", the board an image renders; "." is `EMPTY`)::

    board: [[ 5,  .,  .],
            [ .,  ., 30],
            [ 5,  .,  .]]
    label: 1        (object 5, mask 1 in green, appears twice)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from .match_pattern import MatchPattern
from .registry import Split, Task, balanced_labels, distinct_tokens, register_task

SHAPE_SETS = ("train", "heldout")
MASK_CELLS = {"train": 5, "heldout": 6}
PALETTES = {
    "train": ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (1.0, 1.0, 0.0)),
    "heldout": ((0.0, 1.0, 1.0), (1.0, 0.0, 1.0), (1.0, 0.5, 0.0), (0.5, 0.0, 1.0)),
}
MASKS_PER_SET = 8
COLOURS_PER_SET = 4  # the length of each palette
OBJECTS_PER_SET = MASKS_PER_SET * COLOURS_PER_SET  # every mask in every colour of its set
TARGET = len(SHAPE_SETS) * OBJECTS_PER_SET
EMPTY = TARGET + 1
BANK_SEED = 2020
GRID = torch.arange(9).view(3, 3)  # cell positions, row-major
LINES = torch.cat([GRID, GRID.T])  # (6, 3): the rows and the columns


def _spanning_polyominoes(k: int) -> list[tuple[int, ...]]:
    """Connected k-cell subsets of the 3 x 3 grid (cells 0..8, row-major) touching all sides."""

    def connected(cells: tuple[int, ...]) -> bool:
        seen, todo = {cells[0]}, [cells[0]]
        while todo:
            r, c = divmod(todo.pop(), 3)
            for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                cell = 3 * rr + cc
                if 0 <= rr < 3 and 0 <= cc < 3 and cell in cells and cell not in seen:
                    seen.add(cell)
                    todo.append(cell)
        return len(seen) == k

    return [
        cells
        for cells in itertools.combinations(range(9), k)
        if {x // 3 for x in cells} == {x % 3 for x in cells} == {0, 1, 2} and connected(cells)
    ]


@cache
def shape_bank() -> tuple[Tensor, Tensor]:
    """Every board id's mask ``(EMPTY + 1, 3, 3)`` bool and colour ``(EMPTY + 1, 3)``."""
    generator = torch.Generator().manual_seed(BANK_SEED)
    masks, colours = [], []
    for name in SHAPE_SETS:
        shapes = _spanning_polyominoes(MASK_CELLS[name])
        for i in torch.randperm(len(shapes), generator=generator)[:MASKS_PER_SET].tolist():
            mask = torch.zeros(9, dtype=torch.bool)
            mask[list(shapes[i])] = True
            masks += [mask.view(3, 3)] * len(PALETTES[name])
            colours += PALETTES[name]
    frame = torch.ones(3, 3, dtype=torch.bool)
    frame[1, 1] = False
    masks += [frame, torch.zeros(3, 3, dtype=torch.bool)]  # TARGET, EMPTY
    colours += [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0)]
    return torch.stack(masks), torch.tensor(colours)


MAX_CELL = 128  # pixels per cell, at most


@cache
def tiles(cell_size: int) -> Tensor:
    """Every board id drawn as one cell: ``(EMPTY + 1, 3, cell_size, cell_size)`` in [0, 1]."""
    masks, colours = shape_bank()
    inner = F.interpolate(masks[:, None].float(), size=cell_size - 2, mode="nearest")
    return F.pad(inner, (1, 1, 1, 1)) * colours[:, :, None, None]


def object_ids(shape_set: str) -> Tensor:
    """The board ids of the objects of `shape_set`, ``(OBJECTS_PER_SET,)``."""
    return SHAPE_SETS.index(shape_set) * OBJECTS_PER_SET + torch.arange(OBJECTS_PER_SET)


def _shuffled(x: Tensor, generator: torch.Generator) -> Tensor:
    """Each row of `x` (n, k) in its own random order."""
    return x.gather(1, torch.rand(x.shape, generator=generator).argsort(dim=1))


# Each problem draws n boards from the objects `ids` as (positions (n, k), objects (n, k),
# labels (n,)): object i of a board sits at cell positions[:, i] (row-major, 0..8).
Boards = tuple[Tensor, Tensor, Tensor]


def _rows(top: Tensor, bottom: Tensor, labels: Tensor) -> Boards:
    """Boards whose top and bottom rows hold `top` and `bottom` (n, 3); the middle row empty."""
    positions = torch.cat([GRID[0], GRID[2]]).expand(len(top), 6)
    return positions, torch.cat([top, bottom], dim=1), labels


def _same(n: int, ids: Tensor, generator: torch.Generator) -> Boards:
    labels = balanced_labels(n, 2, generator)
    objects = ids[distinct_tokens(n, 3, len(ids), generator)]
    objects[:, 2] = torch.where(labels.bool(), objects[:, 0], objects[:, 2])
    return distinct_tokens(n, 3, 9, generator), objects, labels


def _between(n: int, ids: Tensor, generator: torch.Generator) -> Boards:
    labels = balanced_labels(n, 2, generator)
    slots = torch.tensor([[0, 1, 0], [0, 0, 1], [1, 0, 0]])  # ABA, AAB, BAA
    pattern = torch.where(labels.bool(), 0, torch.randint(1, 3, (n,), generator=generator))
    pair = ids[distinct_tokens(n, 2, len(ids), generator)]  # (n, 2): A, B
    line = LINES[torch.randint(len(LINES), (n,), generator=generator)]
    return line, pair.gather(1, slots[pattern]), labels


def _occurs(n: int, ids: Tensor, generator: torch.Generator) -> Boards:
    labels = balanced_labels(n, 2, generator)
    objects = ids[distinct_tokens(n, 4, len(ids), generator)]
    bottom, other = objects[:, :3], objects[:, 3]
    copied = bottom.gather(1, torch.randint(3, (n, 1), generator=generator)).squeeze(1)
    top = torch.where(labels.bool(), copied, other)
    top_position = torch.randint(3, (n, 1), generator=generator)
    positions = torch.cat([top_position, GRID[2].expand(n, 3)], dim=1)
    return positions, torch.cat([top[:, None], bottom], dim=1), labels


def _xoccurs(n: int, ids: Tensor, generator: torch.Generator) -> Boards:
    labels = balanced_labels(n, 2, generator)
    shared = torch.where(labels.bool(), 1, 2 * torch.randint(2, (n,), generator=generator))
    objects = ids[distinct_tokens(n, 6, len(ids), generator)]
    top, bottom = objects[:, :3], objects[:, 3:]
    bottom = torch.where(torch.arange(3) < shared[:, None], top, bottom)  # share `shared`
    return _rows(_shuffled(top, generator), _shuffled(bottom, generator), labels)


def _row_match(n: int, ids: Tensor, generator: torch.Generator) -> Boards:
    labels = balanced_labels(n, 2, generator)
    objects = ids[distinct_tokens(n, 4, len(ids), generator)]
    top, fresh = objects[:, :3], objects[:, 3:]
    reorders = torch.tensor(list(itertools.permutations(range(3)))[1:])  # (5, 3), no identity
    reordered = top.gather(1, reorders[torch.randint(5, (n,), generator=generator)])
    swapped_column = torch.randint(3, (n, 1), generator=generator)
    swapped = torch.where(torch.arange(3) == swapped_column, fresh, top)
    negative = torch.where(torch.rand(n, 1, generator=generator) < 0.5, reordered, swapped)
    return _rows(top, torch.where(labels.bool()[:, None], top, negative), labels)


def _left_of(n: int, ids: Tensor, generator: torch.Generator) -> Boards:
    labels = balanced_labels(n, 2, generator)
    left, right = distinct_tokens(n, 2, 3, generator).sort(dim=1).values.unbind(1)
    target_column = torch.where(labels.bool(), left, right)
    other_column = torch.where(labels.bool(), right, left)
    rows = torch.randint(3, (n, 2), generator=generator)
    positions = 3 * rows + torch.stack([target_column, other_column], dim=1)
    other = ids[torch.randint(len(ids), (n,), generator=generator)]
    return positions, torch.stack([torch.full_like(other, TARGET), other], dim=1), labels


def _match_pattern(n: int, ids: Tensor, generator: torch.Generator) -> Boards:
    triples, labels = MatchPattern(vocab_size=len(ids)).generate(n, generator)  # (n, 6)
    return _rows(ids[triples[:, :3]], ids[triples[:, 3:]], labels)


PROBLEMS: dict[str, Callable[[int, Tensor, torch.Generator], Boards]] = {
    "same": _same,
    "between": _between,
    "occurs": _occurs,
    "xoccurs": _xoccurs,
    "row_match": _row_match,
    "left_of": _left_of,
    "match_pattern": _match_pattern,
}


@register_task("relational_games")
@dataclass(frozen=True)
class RelationalGames(Task):
    kind: ClassVar[str] = "image_classification"
    num_classes: ClassVar[int] = 2
    problem: str = "same"
    cell_size: int = 8
    shape_set: str = "train"
    test_shape_set: str = "train"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.problem not in PROBLEMS:
            raise ValueError(f"problem must be one of {', '.join(PROBLEMS)}; got {self.problem!r}")
        for field in ("shape_set", "test_shape_set"):
            if getattr(self, field) not in SHAPE_SETS:
                raise ValueError(
                    f"{field} must be one of {', '.join(SHAPE_SETS)}; got {getattr(self, field)!r}"
                )
        if not 5 <= self.cell_size <= MAX_CELL:
            raise ValueError(
                f"cell_size must be in [5, {MAX_CELL}] (3 x 3 mask + margin; every tile of every "
                f"shape is drawn at that size), got {self.cell_size}"
            )

    @property
    def patch_size(self) -> int:
        return self.cell_size

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (3, 3 * self.cell_size, 3 * self.cell_size)

    def generate_boards(
        self, n: int, generator: torch.Generator, shape_set: str | None = None
    ) -> tuple[Tensor, Tensor]:
        """`n` boards of board ids ``(n, 3, 3)`` with objects from `shape_set` (default
        `self.shape_set`), and their labels ``(n,)``."""
        ids = object_ids(shape_set or self.shape_set)
        positions, objects, labels = PROBLEMS[self.problem](n, ids, generator)
        boards = torch.full((n, 9), EMPTY).scatter_(1, positions, objects)
        return boards.view(n, 3, 3), labels

    def render(self, boards: Tensor) -> Tensor:
        """Board ids ``(n, 3, 3)`` -> float32 images ``(n, 3, 3 cell_size, 3 cell_size)``."""
        return rearrange(tiles(self.cell_size)[boards], "n gh gw c h w -> n c (gh h) (gw w)")

    def generate(
        self, n: int, generator: torch.Generator, shape_set: str | None = None
    ) -> tuple[Tensor, Tensor]:
        boards, labels = self.generate_boards(n, generator, shape_set)
        return self.render(boards), labels

    @property
    def total_examples(self) -> int:
        return self.n_train + self.n_validation + 3 * self.n_test

    def splits(self, seed: int) -> dict[str, Split]:
        """As `Task.splits`, but the test split draws its objects from `test_shape_set`; and
        two more test splits of `n_test` boards each: "test_id" from `shape_set` (in
        distribution) and "test_ood" from the other shape set (out of distribution), drawn
        after the first three (which stay as they were without them)."""
        self.check_size()
        generator = torch.Generator().manual_seed(seed)
        (other,) = (s for s in SHAPE_SETS if s != self.shape_set)
        plan = {
            "train": (self.n_train, self.shape_set),
            "validation": (self.n_validation, self.shape_set),
            "test": (self.n_test, self.test_shape_set),
            "test_id": (self.n_test, self.shape_set),
            "test_ood": (self.n_test, other),
        }
        return {name: Split(*self.generate(n, generator, s)) for name, (n, s) in plan.items()}
