"""mqar: multi-query associative recall (zoology's `multiquery_ar`), language-model style.

The sequence opens with ``num_kv_pairs`` key-value pairs ``k1 v1 k2 v2 ...``; keys are distinct
tokens of ``[1, vocab_size // 2)``, values tokens of ``[vocab_size // 2, vocab_size)``. The rest
is zeros (token 0 is filler) except that every key is queried once, in random order, at a random
even offset of the query region, followed by its value. The model reads ``inputs`` and predicts
the next token; ``targets`` is the value at each queried key's position and -1 everywhere else.

Literal example (vocab_size=16, seq_len=12, num_kv_pairs=2)::

    x      : [3, 12, 5, 9, 0, 0, 5, 9, 0, 0, 3, 12, 0]    (seq_len + 1 tokens)
    inputs : [3, 12, 5, 9, 0, 0, 5, 9, 0, 0, 3, 12]       (x[:-1])
    targets: [-1, -1, -1, -1, -1, -1, 9, -1, -1, -1, 12, -1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .registry import IGNORE_INDEX, Task, distinct_tokens, register_task


@register_task("mqar")
@dataclass(frozen=True)
class MQAR(Task):
    kind: ClassVar[str] = "language_model"
    vocab_size: int = 64
    seq_len: int = 64
    num_kv_pairs: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        d = self.num_kv_pairs
        if d < 1 or self.vocab_size // 2 - 1 < d or self.vocab_size - self.vocab_size // 2 < d:
            raise ValueError(
                f"vocab_size={self.vocab_size} too small for {d} distinct keys and values"
            )
        if (self.seq_len + 1 - 2 * d) // 2 < d:
            raise ValueError(f"seq_len must be >= {4 * d} for num_kv_pairs={d}, got {self.seq_len}")

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        d, half = self.num_kv_pairs, self.vocab_size // 2
        keys = 1 + distinct_tokens(n, d, half - 1, generator)  # (n, d) in [1, half)
        values = half + distinct_tokens(n, d, self.vocab_size - half, generator)
        x = torch.zeros(n, self.seq_len + 1, dtype=torch.long)
        x[:, 0 : 2 * d : 2], x[:, 1 : 2 * d : 2] = keys, values
        slots = (self.seq_len + 1 - 2 * d) // 2  # query region: pairs of positions
        key_pos = 2 * d + 2 * distinct_tokens(n, d, slots, generator)  # (n, d); key i queried here
        x.scatter_(1, key_pos, keys)
        x.scatter_(1, key_pos + 1, values)
        targets = torch.full((n, self.seq_len), IGNORE_INDEX, dtype=torch.long)
        targets.scatter_(1, key_pos, values)
        return x[:, :-1], targets
