"""match_pattern: do two triples of fresh objects follow the same relational pattern?

From the Abstractor / dual-attention (DAT) line of work. Each example holds two triples; each
triple follows one of the patterns AAA, AAB, ABA, ABB, ABC, and the six objects are drawn
without replacement, so the second triple never reuses an object of the first: only the
relation between objects, never their identity, tells the label. Label 1 when both triples
follow the same pattern, else 0; the classes are balanced (the differing pattern is uniform).

Literal example (vocab_size=64; triples ABA and ABA)::

    input: [17, 3, 17, 42, 9, 42]
    label: 1

With ``objects="vectors"`` the six objects are fresh random vectors instead of tokens:
``object_dim`` standard normal entries (the scale of a token embedding's), drawn anew for every
example (inputs (n, 6, object_dim) float32, `input_dim` = object_dim), so no object is ever
seen twice and every test example is out of distribution in its objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .registry import Task, balanced_labels, distinct_tokens, register_task

OBJECTS = ("tokens", "vectors")
PATTERNS = {
    "AAA": (0, 0, 0),
    "AAB": (0, 0, 1),
    "ABA": (0, 1, 0),
    "ABB": (0, 1, 1),
    "ABC": (0, 1, 2),
}


@register_task("match_pattern")
@dataclass(frozen=True)
class MatchPattern(Task):
    kind: ClassVar[str] = "classification"
    num_classes: ClassVar[int] = 2
    seq_len: ClassVar[int] = 6
    vocab_size: int = 64
    objects: str = "tokens"
    object_dim: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab_size < 6:
            raise ValueError(
                f"vocab_size must be >= 6 (six distinct objects), got {self.vocab_size}"
            )
        if self.objects not in OBJECTS:
            raise ValueError(f"objects must be one of {', '.join(OBJECTS)}; got {self.objects!r}")
        if self.object_dim < 1:
            raise ValueError(f"object_dim must be >= 1, got {self.object_dim}")

    @property
    def input_dim(self) -> int | None:
        """The width of vector inputs (``objects="vectors"``), None for tokens."""
        return self.object_dim if self.objects == "vectors" else None

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        patterns = torch.tensor(list(PATTERNS.values()))  # (5, 3): object slot per position
        labels = balanced_labels(n, 2, generator)
        first = torch.randint(len(PATTERNS), (n,), generator=generator)
        shift = torch.randint(1, len(PATTERNS), (n,), generator=generator)
        second = torch.where(labels.bool(), first, (first + shift) % len(PATTERNS))
        slots = torch.cat([patterns[first], patterns[second] + 3], dim=1)  # (n, 6) in [0, 6)
        if self.objects == "vectors":
            vectors = torch.randn(n, 6, self.object_dim, generator=generator)
            return vectors.gather(1, slots[..., None].expand_as(vectors)), labels
        objects = distinct_tokens(n, 6, self.vocab_size, generator)  # (n, 6)
        return objects.gather(1, slots), labels
