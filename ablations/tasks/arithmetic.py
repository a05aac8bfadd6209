"""arithmetic: compute a sum, a product or a polynomial's value, character by character (seq2seq).

The source is the problem written out in decimal, one token per character, padded with PAD:

* ``addition``: ``a+b``; ``multiplication``: ``a*b``, with operands of ``max_digits`` digits
  at most;
* ``polynomial``: ``c2x^2+c1x+c0,x=v``, the value of ``c2 v^2 + c1 v + c0`` (exact, no
  modulus) with single-digit coefficients (0-9, always all three written) and ``v`` of
  ``max_digits`` digits at most.

Each operand's digit count is uniform over 1 .. its maximum, then its value uniform over the
numbers with that many digits (0-9 for one digit). The target is START, the answer's digits,
END, then -1 (`IGNORE_INDEX`); the answer is written least significant digit first when
``reverse_answer`` (the default: each digit then depends only on digits already written), else
most significant first. Source and target share one vocabulary: the characters of `CHARS` are
tokens 0-15 (a digit's token is its value), then PAD, START and END.

Literal example (operation="addition", max_digits=3, reverse_answer=True; PAD=16, START=17,
END=18)::

    source : "123+45"  inputs : [1, 2, 3, 10, 4, 5, 16]
    answer : 168       targets: [17, 8, 6, 1, 18, -1]
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .registry import IGNORE_INDEX, Task, register_task

CHARS = "0123456789+*x^,="
PAD, START, END = len(CHARS), len(CHARS) + 1, len(CHARS) + 2
TEMPLATES = {  # the source of each operation; {i} is operand i
    "addition": "{0}+{1}",
    "multiplication": "{0}*{1}",
    "polynomial": "{0}x^2+{1}x+{2},x={3}",
}
Piece = tuple[Tensor, Tensor]  # tokens (n, width), left-aligned, and their lengths (n,)


def digits(values: Tensor, width: int, reverse: bool = False) -> Piece:
    """The decimal digits of `values` (n,) as tokens, most significant first unless `reverse`,
    in ``(n, width)`` (width >= the longest), and the digit counts (n,)."""
    counts = 1 + (values[:, None] >= 10 ** torch.arange(1, width)).sum(dim=1)
    place = torch.arange(width)
    exponent = place if reverse else (counts[:, None] - 1 - place).clamp(min=0)
    return values[:, None] // 10**exponent % 10, counts


def constant(tokens: list[int], n: int) -> Piece:
    """The same `tokens` in each of `n` rows."""
    return torch.tensor(tokens).expand(n, -1), torch.full((n,), len(tokens))


def concatenate(pieces: list[Piece], width: int, fill: int) -> Tensor:
    """Each row's pieces written one after the other from the left, then `fill`: (n, width)."""
    n = len(pieces[0][1])
    out = torch.full((n, width), fill)
    start = torch.zeros(n, dtype=torch.long)
    for tokens, lengths in pieces:
        rows, cols = (torch.arange(tokens.shape[1]) < lengths[:, None]).nonzero(as_tuple=True)
        out[rows, start[rows] + cols] = tokens[rows, cols]
        start = start + lengths
    return out


@register_task("arithmetic")
@dataclass(frozen=True)
class Arithmetic(Task):
    kind: ClassVar[str] = "seq2seq"
    vocab_size: ClassVar[int] = len(CHARS) + 3
    pad_token: ClassVar[int] = PAD
    start_token: ClassVar[int] = START
    end_token: ClassVar[int] = END
    operation: str = "addition"
    max_digits: int = 3
    reverse_answer: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.operation not in TEMPLATES:
            raise ValueError(
                f"operation must be one of {', '.join(TEMPLATES)}; got {self.operation!r}"
            )
        if not 1 <= self.max_digits <= 9:
            raise ValueError(f"max_digits must be in 1..9 (int64 answers), got {self.max_digits}")

    @property
    def operand_digits(self) -> tuple[int, ...]:
        """The most digits of each operand, in template order."""
        if self.operation == "polynomial":
            return (1, 1, 1, self.max_digits)
        return (self.max_digits, self.max_digits)

    @property
    def seq_len(self) -> int:
        literals = string.Formatter().parse(TEMPLATES[self.operation])
        return sum(len(text) for text, *_ in literals) + sum(self.operand_digits)

    @property
    def answer_digits(self) -> int:
        """The most digits of an answer (the answer grows with every operand)."""
        largest = torch.tensor([[10**d - 1 for d in self.operand_digits]])
        return len(str(int(self.evaluate(largest))))

    @property
    def target_len(self) -> int:
        return self.answer_digits + 2

    def evaluate(self, operands: Tensor) -> Tensor:
        """The answers (n,) to operands (n, k) in template order."""
        if self.operation == "addition":
            return operands[:, 0] + operands[:, 1]
        if self.operation == "multiplication":
            return operands[:, 0] * operands[:, 1]
        c2, c1, c0, x = operands.unbind(dim=1)
        return (c2 * x + c1) * x + c0

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        most = torch.tensor(self.operand_digits)
        counts = 1 + (torch.rand(n, len(most), generator=generator) * most).long()  # (n, k)
        low = torch.where(counts == 1, 0, 10 ** (counts - 1))
        uniform = torch.rand(n, len(most), generator=generator, dtype=torch.float64)
        operands = low + (uniform * (10**counts - low)).long()  # (n, k)
        source = []
        for text, field, *_ in string.Formatter().parse(TEMPLATES[self.operation]):
            if text:
                source.append(constant([CHARS.index(c) for c in text], n))
            if field is not None:
                i = int(field)
                source.append(digits(operands[:, i], self.operand_digits[i]))
        answer = digits(self.evaluate(operands), self.answer_digits, self.reverse_answer)
        target = [constant([START], n), answer, constant([END], n)]
        inputs = concatenate(source, self.seq_len, PAD)
        return inputs, concatenate(target, self.target_len, IGNORE_INDEX)

    def decode(self, ids: Tensor | list[int]) -> str:
        """Tokens as text: characters, START as "<", END as ">"; PAD and -1 dropped."""
        names = {**dict(enumerate(CHARS)), START: "<", END: ">"}
        return "".join(names.get(i, "") for i in torch.as_tensor(ids).tolist())
