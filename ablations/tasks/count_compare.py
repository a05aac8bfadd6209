"""count_compare: is digit 4 more frequent than digit 2 in a digit sequence?

Input: ``seq_len`` digits uniform over 0..9 (``vocab_size = 10``). Label 1 when 4 occurs
strictly more often than 2, else 0 (a tie is 0). Classes are balanced by drawing candidate
sequences and keeping equally many of each label (so each class is uniform sequences
conditioned on its label).

Literal example (seq_len=8)::

    input: [4, 1, 2, 4, 9, 0, 4, 7]
    label: 1        (three 4s, one 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .registry import Task, register_task


@register_task("count_compare")
@dataclass(frozen=True)
class CountCompare(Task):
    kind: ClassVar[str] = "classification"
    num_classes: ClassVar[int] = 2
    vocab_size: ClassVar[int] = 10
    seq_len: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        wanted = {1: n // 2, 0: n - n // 2}
        kept: dict[int, list[Tensor]] = {0: [], 1: []}
        have = {0: 0, 1: 0}
        while any(have[c] < wanted[c] for c in (0, 1)):  # ~2 rounds: each class has p >= 0.3
            x = torch.randint(10, (2 * n + 16, self.seq_len), generator=generator)
            label = ((x == 4).sum(1) > (x == 2).sum(1)).long()
            for c in (0, 1):
                take = x[label == c][: wanted[c] - have[c]]
                kept[c].append(take)
                have[c] += len(take)
        inputs = torch.cat(kept[1] + kept[0])
        labels = torch.cat([torch.ones(wanted[1]), torch.zeros(wanted[0])]).long()
        order = torch.randperm(n, generator=generator)
        return inputs[order], labels[order]
