"""grammar: next-token prediction on sentences of a small English-like probabilistic grammar.

Sentences are sampled from this context-free grammar (number agreement spelt out: ``X_n`` is
X with number n, singular ``sg`` or plural ``pl``; ``p = recursion_prob``)::

    S     -> NP_sg VP_sg "."  (1/2)   | NP_pl VP_pl "."  (1/2)
    NP    -> NP_sg  (1/2)             | NP_pl  (1/2)
    NP_n  -> Det_n N_n  (1 - p)       | Det_n N_n RC_n  (p/2)   | Det_n N_n PP  (p/2)
    RC_n  -> "that" VP_n  (1/2)       | "that" NP_sg Vt_sg  (1/4) | "that" NP_pl Vt_pl  (1/4)
    VP_n  -> Vi_n  (1/2)              | Vt_n NP  (1/2)
    PP    -> P NP

and each preterminal (``Det_n``, ``N_n``, ``Vi_n``, ``Vt_n``, ``P``) is a uniform choice from
`LEXICON`. Relative clauses and prepositional phrases nest: a noun phrase inside
``max_depth`` of them takes its first rule, so nesting never goes deeper. The verb of a clause
agrees with its subject across any nesting in between (``the dog near the cats runs``), the
long-range dependency that makes the task interesting.

Each sequence is a fresh run of sentences, cut to ``length + 1`` tokens (the last sentence
usually cut short): ``inputs = x[:-1]`` and ``targets = x[1:]``, every position scored. Tokens
are the indices of the words in `VOCAB`.

Literal example (length=12), ``x = the dog that the cats chase sleeps . some birds sing . a``::

    inputs : [2, 7, 1, 2, 14, 30, 19, 0, 5, 15, 24, 0]
    targets: [7, 1, 2, 14, 30, 19, 0, 5, 15, 24, 0, 3]

With ``unit="char"`` the same text is spelt out in characters, each word and "." followed by a
space (``"the dog runs . "``), tokens the indices of the characters in `CHARS` (24: space, ".",
and the 22 letters the words use): character-level language modelling, where an agreement
spans tens of tokens instead of a few.

The grammar's own probabilities give the floor under any model's loss: `best_losses` is the
true -log P(targets | first token) / length of each window (`prefix_probability` parses the
cut last sentence), so a report can say how far above the best possible a model is.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import torch
from torch import Tensor

from .registry import Task, register_task

LEXICON = {
    "Det_sg": ("the", "a", "every"),
    "Det_pl": ("the", "some", "many"),
    "N_sg": ("dog", "cat", "bird", "child", "teacher", "farmer"),
    "N_pl": ("dogs", "cats", "birds", "children", "teachers", "farmers"),
    "Vi_sg": ("sleeps", "runs", "sings"),
    "Vi_pl": ("sleep", "run", "sing"),
    "Vt_sg": ("sees", "likes", "chases"),
    "Vt_pl": ("see", "like", "chase"),
    "P": ("near", "behind", "with"),
}
VOCAB = tuple(dict.fromkeys([".", "that", *itertools.chain(*LEXICON.values())]))
TOKEN = {word: i for i, word in enumerate(VOCAB)}
CHARS = tuple(sorted(set(" ".join(VOCAB))))  # " ", ".", then the letters
CHAR = {char: i for i, char in enumerate(CHARS)}
UNITS = ("word", "char")
NESTING = ("RC_sg", "RC_pl", "PP")  # the expansions that nest one level deeper

Rules = dict[str, tuple[tuple[float, tuple[str, ...]], ...]]


def grammar(recursion_prob: float) -> Rules:
    """The rules above: each nonterminal's ``(probability, right-hand side)`` alternatives."""
    p = recursion_prob
    rules: Rules = {
        "S": ((0.5, ("NP_sg", "VP_sg", ".")), (0.5, ("NP_pl", "VP_pl", "."))),
        "NP": ((0.5, ("NP_sg",)), (0.5, ("NP_pl",))),
        "PP": ((1.0, ("P", "NP")),),
    }
    for n in ("sg", "pl"):
        noun = (f"Det_{n}", f"N_{n}")
        rules[f"NP_{n}"] = ((1 - p, noun), (p / 2, (*noun, f"RC_{n}")), (p / 2, (*noun, "PP")))
        rules[f"RC_{n}"] = (
            (0.5, ("that", f"VP_{n}")),
            (0.25, ("that", "NP_sg", "Vt_sg")),
            (0.25, ("that", "NP_pl", "Vt_pl")),
        )
        rules[f"VP_{n}"] = ((0.5, (f"Vi_{n}",)), (0.5, (f"Vt_{n}", "NP")))
    for tag, words in LEXICON.items():
        rules[tag] = tuple((1 / len(words), (word,)) for word in words)
    return rules


def uniforms(generator: torch.Generator, chunk: int = 1 << 14) -> Iterator[float]:
    """An endless stream of uniform [0, 1) floats drawn from `generator`, `chunk` at a time."""
    while True:
        yield from torch.rand(chunk, generator=generator, dtype=torch.float64).tolist()


@register_task("grammar")
@dataclass(frozen=True)
class Grammar(Task):
    kind: ClassVar[str] = "language_model"
    length: int = 64
    max_depth: int = 3
    recursion_prob: float = 0.3
    unit: str = "word"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.length < 1:
            raise ValueError(f"length must be >= 1, got {self.length}")
        if self.max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {self.max_depth}")
        if not 0 <= self.recursion_prob <= 1:
            raise ValueError(f"recursion_prob must be in [0, 1], got {self.recursion_prob}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {self.unit!r}")

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def vocab_size(self) -> int:
        return len(CHARS) if self.unit == "char" else len(VOCAB)

    def first_rule_only(self, symbol: str, depth: int) -> bool:
        """Whether `symbol` at nesting `depth` must take its first rule (a noun phrase nested
        `max_depth` deep), with probability 1."""
        return symbol.startswith("NP_") and depth >= self.max_depth

    def sentence(self, rules: Rules, uniform: Iterator[float]) -> tuple[list[int], float]:
        """One sentence of `S` as word ids, each choice made with the next of `uniform`, and
        the natural log of its probability (the product of the probabilities of its choices)."""
        tokens, stack, log_prob = [], [("S", 0)], 0.0  # (symbol, nesting depth), leftmost on top
        while stack:
            symbol, depth = stack.pop()
            if symbol in TOKEN:
                tokens.append(TOKEN[symbol])
                continue
            alternatives = rules[symbol]
            if self.first_rule_only(symbol, depth):
                rhs = alternatives[0][1]
            else:
                u, (prob, rhs) = next(uniform), alternatives[-1]  # the last if rounding leaves u
                for candidate_prob, candidate in alternatives:
                    if u < candidate_prob:
                        prob, rhs = candidate_prob, candidate
                        break
                    u -= candidate_prob
                log_prob += math.log(prob)
            child_depth = depth + (symbol in NESTING)
            stack.extend((child, child_depth) for child in reversed(rhs))
        return tokens, log_prob

    def prefix_probability(self, words: Sequence[str], partial: str = "") -> float:
        """P(a sentence begins with `words`, then, if `partial` is not empty, with a word that
        begins with `partial`): the probability of every derivation of `S` whose words start
        so, summed (an inside computation that treats whatever follows the prefix as any
        continuation, of total probability 1). For a whole sentence (ending in ".") this is
        its probability."""
        rules, n = grammar(self.recursion_prob), len(words) + bool(partial)

        @cache
        def spans(symbol: str, i: int, depth: int) -> tuple[tuple[int, float], ...]:
            """(end, probability) for each end: `symbol` derives words[i:end] (to the prefix's
            end: derives something that starts with what is left of the prefix)."""
            if i == n:
                return ((n, 1.0),)
            if symbol in TOKEN:
                fits = words[i] == symbol if i < len(words) else symbol.startswith(partial)
                return ((i + 1, 1.0),) if fits else ()
            alternatives = rules[symbol]
            if self.first_rule_only(symbol, depth):
                alternatives = ((1.0, alternatives[0][1]),)
            child_depth = depth + (symbol in NESTING)
            ends: defaultdict[int, float] = defaultdict(float)
            for prob, rhs in alternatives:
                reached = {i: prob}  # where the children so far can end, and how likely
                for child in rhs:
                    after: defaultdict[int, float] = defaultdict(float)
                    for start, p in reached.items():
                        for end, q in spans(child, start, child_depth):
                            after[end] += p * q
                    reached = after
                for end, p in reached.items():
                    ends[end] += p
            return tuple(ends.items())

        return dict(spans("S", 0, 0)).get(n, 0.0)

    def best_losses(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """The lowest loss any model can have on each window made by `generate` (inputs and
        targets ``(n, length)``), in nats per token, shape ``(n,)``: the true
        -log P(targets | first input token) / length, where P(a window) is the product of its
        whole sentences' probabilities and the prefix probability of its cut last sentence.
        Its mean over a split is the floor under a language model's loss there."""
        losses = torch.empty(len(inputs), dtype=torch.float64)
        for r, row in enumerate(torch.cat([inputs, targets[:, -1:]], dim=1)):
            text, partial = self.decode(row), ""
            if self.unit == "char":  # the first token begins a word; the last may end one
                head = self.prefix_probability([], text[0])
                text, _, partial = text.rpartition(" ")
            else:
                head = self.prefix_probability(text.split()[:1])
            *sentences, rest = text.split(".")
            log_prob = sum(math.log(self.prefix_probability([*s.split(), "."])) for s in sentences)
            log_prob += math.log(self.prefix_probability(rest.split(), partial))
            losses[r] = (math.log(head) - log_prob) / self.length
        return losses

    def generate(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        rules, uniform = grammar(self.recursion_prob), uniforms(generator)
        rows = []
        for _ in range(n):
            row: list[int] = []
            while len(row) <= self.length:
                words, _ = self.sentence(rules, uniform)
                if self.unit == "char":
                    row += [CHAR[c] for word in words for c in VOCAB[word] + " "]
                else:
                    row += words
            rows.append(row[: self.length + 1])
        x = torch.tensor(rows)
        return x[:, :-1], x[:, 1:]

    def decode(self, ids: Tensor | list[int]) -> str:
        """Token ids as text: space-separated words, or the characters as they are."""
        ids = torch.as_tensor(ids).tolist()
        if self.unit == "char":
            return "".join(CHARS[i] for i in ids)
        return " ".join(VOCAB[i] for i in ids)
