"""copy: repeat a sequence after a separator, language-model style.

``x = a_1 .. a_L SEP a_1 .. a_L`` with content tokens uniform over ``[0, vocab_size - 1)``
and ``SEP = vocab_size - 1``; ``inputs = x[:-1]`` (``seq_len = 2 L``) and ``targets = x[1:]``
with -1 wherever the next token is not part of the copy (everything before SEP is unscored).

Literal example (vocab_size=10, length=3; SEP=9)::

    inputs : [4, 0, 7, 9, 4, 0]
    targets: [-1, -1, -1, 4, 0, 7]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .registry import IGNORE_INDEX, Task, register_task


def separated_lm_example(source: Tensor, answer: Tensor, sep: int) -> tuple[Tensor, Tensor]:
    """``source SEP answer`` as next-token `(inputs, targets)`, scoring only the answer."""
    n, length = source.shape
    x = torch.cat([source, torch.full((n, 1), sep), answer], dim=1)  # (n, 2L + 1)
    targets = x[:, 1:].clone()
    targets[:, :length] = IGNORE_INDEX
    return x[:, :-1], targets


@dataclass(frozen=True)
class SourceToAnswer(Task):
    """``source SEP answer(source)``: random source tokens in [0, vocab_size - 1), SEP the last
    token id; subclasses define `answer`."""

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

    def answer(self, source: Tensor) -> Tensor:
        raise NotImplementedError

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        source = torch.randint(self.vocab_size - 1, (n, self.length), generator=generator)
        return separated_lm_example(source, self.answer(source), self.sep)


@register_task("copy")
@dataclass(frozen=True)
class Copy(SourceToAnswer):
    def answer(self, source: Tensor) -> Tensor:
        return source
