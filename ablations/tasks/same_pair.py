"""same_pair: are two objects the same token?

Two tokens drawn from ``[0, vocab_size)``; label 1 when they are equal, else 0. Classes are
balanced; in a negative pair the second token is uniform over the other vocab_size - 1 tokens.

Literal examples (vocab_size=32)::

    input: [7, 7]    label: 1
    input: [7, 19]   label: 0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .registry import Task, balanced_labels, register_task


@register_task("same_pair")
@dataclass(frozen=True)
class SamePair(Task):
    kind: ClassVar[str] = "classification"
    num_classes: ClassVar[int] = 2
    seq_len: ClassVar[int] = 2
    vocab_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        labels = balanced_labels(n, 2, generator)
        a = torch.randint(self.vocab_size, (n,), generator=generator)
        shift = torch.randint(1, self.vocab_size, (n,), generator=generator)
        b = torch.where(labels.bool(), a, (a + shift) % self.vocab_size)
        return torch.stack([a, b], dim=1), labels
