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

from torch import Tensor

from .copying import SourceToAnswer
from .registry import register_task


@register_task("sort")
@dataclass(frozen=True)
class Sort(SourceToAnswer):
    def answer(self, source: Tensor) -> Tensor:
        return source.sort(dim=1).values
