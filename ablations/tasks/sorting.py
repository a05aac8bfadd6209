"""sort: write a sequence's tokens in ascending order after a separator, language-model style.

``x = a_1 .. a_L SEP sorted(a)`` with content tokens uniform over ``[0, vocab_size - 1)``
(repeats allowed) and ``SEP = vocab_size - 1``; ``inputs = x[:-1]`` (``seq_len = 2 L``) and
``targets = x[1:]`` with -1 before SEP, as in `copy`.

Literal example (vocab_size=10, length=3; SEP=9)::

    inputs : [4, 0, 4, 9, 0, 4]
    targets: [-1, -1, -1, 0, 4, 4]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .copying import separated_lm_example
from .registry import Task, register_task


@register_task("sort")
@dataclass(frozen=True)
class Sort(Task):
    kind: ClassVar[str] = "language_model"
    vocab_size: int = 16
    length: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab_size < 2 or self.length < 1:
            raise ValueError(
                f"need vocab_size >= 2, length >= 1, got {self.vocab_size}, {self.length}"
            )

    @property
    def sep(self) -> int:
        return self.vocab_size - 1

    @property
    def seq_len(self) -> int:
        return 2 * self.length

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        source = torch.randint(self.vocab_size - 1, (n, self.length), generator=generator)
        return separated_lm_example(source, source.sort(dim=1).values, self.sep)
