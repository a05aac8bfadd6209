"""contains_set: does the context contain every token of a query set?

Input: ``set_size`` distinct query tokens, the separator ``SEP = vocab_size - 1``, then
``context_len`` context tokens; content tokens are ``[0, vocab_size - 1)``. Label 1 when every
query token occurs somewhere in the context, else 0. Classes are balanced, and negatives are
hard: the context holds all query tokens but exactly one (the other context tokens are never
query tokens), so a model must check the whole set, not just one member.

Literal example (vocab_size=16, set_size=3, context_len=8; SEP=15)::

    input: [4, 11, 2, 15, 9, 2, 0, 4, 13, 7, 11, 5]
    label: 1        (4, 11 and 2 all occur after SEP)

With context ``[9, 2, 0, 4, 13, 7, 6, 5]`` (11 missing) the label is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .registry import Task, balanced_labels, register_task


@register_task("contains_set")
@dataclass(frozen=True)
class ContainsSet(Task):
    kind: ClassVar[str] = "classification"
    num_classes: ClassVar[int] = 2
    vocab_size: int = 32
    set_size: int = 3
    context_len: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.set_size < 1 or self.context_len < self.set_size:
            raise ValueError(
                f"need 1 <= set_size <= context_len, got {self.set_size} and {self.context_len}"
            )
        if self.vocab_size - 1 <= self.set_size:
            raise ValueError(f"vocab_size must be > set_size + 1, got {self.vocab_size}")

    @property
    def sep(self) -> int:
        return self.vocab_size - 1

    @property
    def seq_len(self) -> int:
        return self.set_size + 1 + self.context_len

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        k, length, content = self.set_size, self.context_len, self.vocab_size - 1
        labels = balanced_labels(n, 2, generator)
        perm = torch.rand(n, content, generator=generator).argsort(dim=1)
        query, others = perm[:, :k], perm[:, k:]  # query tokens; tokens that are not queried
        filler = torch.randint(content - k, (n, length), generator=generator)
        context = others.gather(1, filler)  # (n, length), no query token yet
        where = torch.rand(n, length, generator=generator).argsort(dim=1)[:, :k]
        keep = torch.ones(n, k, dtype=torch.bool)
        missing = torch.randint(k, (n,), generator=generator)
        keep[torch.arange(n), missing] = labels.bool()  # negatives drop one query token
        context = context.scatter(1, where, torch.where(keep, query, context.gather(1, where)))
        sep = torch.full((n, 1), self.sep)
        return torch.cat([query, sep, context], dim=1), labels
