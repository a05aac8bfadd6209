"""relational_games, arithmetic and grammar: shapes, determinism, balance, and every label or
answer checked against an independent recomputation."""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import cache

import pytest
import torch

from ablations.tasks import IGNORE_INDEX, build_task
from ablations.tasks.arithmetic import END, PAD, START
from ablations.tasks.grammar import VOCAB, grammar, uniforms
from ablations.tasks.relational_games import (
    EMPTY,
    MASK_CELLS,
    OBJECTS_PER_SET,
    PALETTES,
    PROBLEMS,
    SHAPE_SETS,
    TARGET,
    object_ids,
    shape_bank,
)

SMALL = {"n_train": 64, "n_validation": 32, "n_test": 32}


def small(name: str, **kwargs):
    return build_task(name, **SMALL, **kwargs)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("relational_games", {"problem": "between"}),
        ("arithmetic", {"operation": "polynomial"}),
        ("grammar", {}),
    ],
)
def test_deterministic_in_seed(name, kwargs):
    a, b, c = (small(name, **kwargs).splits(seed) for seed in (3, 3, 4))
    for split in a:
        assert torch.equal(a[split].inputs, b[split].inputs)
        assert torch.equal(a[split].targets, b[split].targets)
        assert not torch.equal(a[split].inputs, c[split].inputs)
    assert not torch.equal(a["train"].inputs[:32], a["validation"].inputs)


# relational_games: images are decoded back into boards of object ids by matching each cell
# against an independent rendering of every object (a k x k block per mask cell, 1-pixel margin).


def drawn(mask: torch.Tensor, colour: torch.Tensor, cell_size: int) -> torch.Tensor:
    block = (cell_size - 2) // 3
    image = torch.zeros(3, cell_size, cell_size)
    image[:, 1:-1, 1:-1] = (
        torch.kron(mask.float(), torch.ones(block, block)) * colour[:, None, None]
    )
    return image


@cache
def drawings(cell_size: int) -> torch.Tensor:
    masks, colours = shape_bank()
    return torch.stack([drawn(m, c, cell_size) for m, c in zip(masks, colours, strict=True)])


def boards_of(images: torch.Tensor, cell_size: int) -> list[list[list[int]]]:
    """The board id of every cell of `images`, found by exact match with `drawings`."""
    n = len(images)
    cells = images.view(n, 3, 3, cell_size, 3, cell_size).permute(0, 2, 4, 1, 3, 5)
    match = (cells[:, :, :, None] == drawings(cell_size)).flatten(4).all(dim=4)  # (n, 3, 3, ids)
    assert (match.sum(dim=3) == 1).all(), "every cell draws exactly one object (or is empty)"
    return match.int().argmax(dim=3).tolist()


def pattern(row: list[int]) -> tuple[int, ...]:
    return tuple(row.index(x) for x in row)  # AAB -> (0, 0, 2), ABA -> (0, 1, 0), ...


def rule(problem: str, board: list[list[int]]) -> int:
    """The label of `board` recomputed from the problem's definition."""
    top, middle, bottom = board
    objects = [x for row in board for x in row if x != EMPTY]
    if problem == "same":
        assert len(objects) == 3
        return int(len(set(objects)) < 3)
    if problem == "between":
        lines = [*board, *map(list, zip(*board, strict=True))]
        (line,) = [line for line in lines if EMPTY not in line]
        assert len(objects) == 3 and len(set(line)) == 2  # one identical pair, always
        return int(line[0] == line[2])
    if problem == "left_of":
        (target,) = [c for row in board for c, x in enumerate(row) if x == TARGET]
        (other,) = [c for row in board for c, x in enumerate(row) if x not in (TARGET, EMPTY)]
        assert len(objects) == 2 and target != other
        return int(target < other)
    assert middle == [EMPTY] * 3 and EMPTY not in bottom
    if problem == "occurs":
        (obj,) = [x for x in top if x != EMPTY]
        return int(obj in bottom)
    assert EMPTY not in top
    if problem == "match_pattern":
        assert not set(top) & set(bottom)  # fresh objects in the bottom row
        return int(pattern(top) == pattern(bottom))
    assert len(set(top)) == len(set(bottom)) == 3
    if problem == "xoccurs":
        return int(sum(x in bottom for x in top) == 1)
    assert problem == "row_match"
    return int(top == bottom)


@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_relational_games_labels_match_rule(problem):
    task = small("relational_games", problem=problem, test_shape_set="heldout")
    assert task.kind == "image_classification" and task.num_classes == 2
    assert task.image_shape == (3, 24, 24) and task.patch_size == 8
    allowed = {name: {*object_ids(name).tolist(), TARGET, EMPTY} for name in SHAPE_SETS}
    splits = task.splits(seed=0)
    assert list(splits) == ["train", "validation", "test", "test_id", "test_ood"]
    for split, data in splits.items():
        assert data.inputs.shape == (len(data), 3, 24, 24) and data.inputs.dtype == torch.float32
        assert data.targets.dtype == torch.long
        assert Counter(data.targets.tolist()) == {0: len(data) // 2, 1: len(data) // 2}
        boards = boards_of(data.inputs, 8)
        shape_set = "heldout" if split in ("test", "test_ood") else "train"
        for board, label in zip(boards, data.targets.tolist(), strict=True):
            assert {x for row in board for x in row} <= allowed[shape_set]
            assert label == rule(problem, board)


def test_relational_games_extra_test_splits_leave_the_first_three_as_they_were():
    task = small("relational_games", problem="xoccurs", shape_set="heldout", cell_size=5)
    generator = torch.Generator().manual_seed(5)
    plan = [("train", 64, "heldout"), ("validation", 32, "heldout"), ("test", 32, "train")]
    splits = task.splits(seed=5)
    for name, n, shape_set in plan:  # the draws the splits made before test_id and test_ood
        inputs, targets = task.generate(n, generator, shape_set)
        assert torch.equal(splits[name].inputs, inputs)
        assert torch.equal(splits[name].targets, targets)
    # shape_set "heldout": in distribution is heldout, out of distribution the train set
    ids = {name: set(object_ids(name).tolist()) for name in SHAPE_SETS}
    for split, shape_set in (("test_id", "heldout"), ("test_ood", "train")):
        objects = {x for board in boards_of(splits[split].inputs, 5) for row in board for x in row}
        assert objects - {EMPTY} <= ids[shape_set] and objects & ids[shape_set]


def test_relational_games_boards_render_and_cover_the_grid():
    task = build_task("relational_games", problem="same", cell_size=11)
    boards, labels = task.generate_boards(200, torch.Generator().manual_seed(0), "heldout")
    images, labels_again = task.generate(200, torch.Generator().manual_seed(0), "heldout")
    assert images.shape == (200, *task.image_shape) == (200, 3, 33, 33)
    assert boards_of(images, 11) == boards.tolist() and torch.equal(labels, labels_again)
    assert bool(((boards != EMPTY).flatten(1).sum(0) > 0).all())  # objects reach every cell


def test_relational_games_shape_bank():
    masks, colours = shape_bank()
    assert masks.shape == (EMPTY + 1, 3, 3) and colours.shape == (EMPTY + 1, 3)
    seen = set()
    for i, name in enumerate(SHAPE_SETS):
        ids = object_ids(name)
        assert ids.tolist() == list(range(i * OBJECTS_PER_SET, (i + 1) * OBJECTS_PER_SET))
        assert set(masks[ids].flatten(1).sum(1).tolist()) == {MASK_CELLS[name]}
        assert {tuple(c) for c in colours[ids].tolist()} == set(PALETTES[name])
        seen |= {
            (tuple(m), tuple(c))
            for m, c in zip(masks[ids].flatten(1).tolist(), colours[ids].tolist(), strict=True)
        }
    assert len(seen) == len(SHAPE_SETS) * OBJECTS_PER_SET  # every object distinct
    assert not set(PALETTES["train"]) & set(PALETTES["heldout"])
    assert masks[EMPTY].sum() == 0 and masks[TARGET].sum() == 8
    assert torch.equal(shape_bank.__wrapped__()[0], masks)  # deterministic, not cached state


# arithmetic


def answer_of(source: str) -> int:
    """Python's arithmetic on the decoded source."""
    if ",x=" in source:
        expression, x = source.split(",x=")
        return eval(expression.replace("x^2", f"*{x}**2").replace("x", f"*{x}"))
    return eval(source)


@pytest.mark.parametrize("operation", ["addition", "multiplication", "polynomial"])
@pytest.mark.parametrize("reverse_answer", [True, False])
def test_arithmetic_answers(operation, reverse_answer):
    task = build_task(
        "arithmetic", operation=operation, max_digits=2, reverse_answer=reverse_answer
    )
    assert task.kind == "seq2seq"
    data = task.splits(seed=0)["train"]
    x, y = data.inputs, data.targets
    assert x.shape == (2000, task.seq_len) and y.shape == (2000, task.target_len)
    assert x.dtype == y.dtype == torch.long
    assert int(x.min()) >= 0 and int(x.max()) < task.vocab_size
    assert (x[:, -1] != PAD).any() and (y[:, -1] != IGNORE_INDEX).any()  # lengths are tight
    lengths = Counter()
    for source_ids, target_ids in zip(x.tolist(), y.tolist(), strict=True):
        source = task.decode(source_ids)
        body = target_ids[1 : target_ids.index(END)]
        assert target_ids[0] == START and all(0 <= t <= 9 for t in body)
        assert set(target_ids[len(body) + 2 :]) <= {IGNORE_INDEX}
        assert source_ids[len(source) :] == [PAD] * (task.seq_len - len(source))
        numbers = re.findall(r"\d+", source.replace("x^2", "x"))
        assert all(n == "0" or not n.startswith("0") for n in numbers)
        lengths.update(len(n) for n in numbers)
        written = "".join(map(str, body))
        assert int(written[::-1] if reverse_answer else written) == answer_of(source)
    assert set(lengths) == {1, 2}


def test_arithmetic_seq2seq_contract_and_example():
    task = build_task("arithmetic")
    assert (task.vocab_size, task.pad_token, task.start_token) == (19, PAD, START) == (19, 16, 17)
    assert (task.seq_len, task.target_len) == (7, 6)
    assert task.decode([1, 2, 3, 10, 4, 5, 16]) == "123+45"
    assert task.decode([17, 8, 6, 1, 18, -1]) == "<861>" and answer_of("123+45") == 168
    y = task.splits(seed=0)["train"].targets
    decoder_in = y[:, :-1].masked_fill(y[:, :-1] == IGNORE_INDEX, task.pad_token)
    assert int(decoder_in.min()) >= 0 and int(decoder_in.max()) < task.vocab_size
    scored = y[:, 1:][y[:, 1:] != IGNORE_INDEX]
    assert set(scored.tolist()) <= {*range(10), END}


# grammar: an independent recogniser of the grammar in grammar.py's docstring.

WORDS = {
    "Det_sg": "the a every",
    "Det_pl": "the some many",
    "N_sg": "dog cat bird child teacher farmer",
    "N_pl": "dogs cats birds children teachers farmers",
    "Vi_sg": "sleeps runs sings",
    "Vi_pl": "sleep run sing",
    "Vt_sg": "sees likes chases",
    "Vt_pl": "see like chase",
    "P": "near behind with",
}
RULES = {"S": ["NP_sg VP_sg .", "NP_pl VP_pl ."], "NP": ["NP_sg", "NP_pl"], "PP": ["P NP"]}
for n in ("sg", "pl"):
    RULES[f"NP_{n}"] = [f"Det_{n} N_{n}", f"Det_{n} N_{n} RC_{n}", f"Det_{n} N_{n} PP"]
    RULES[f"RC_{n}"] = [f"that VP_{n}", "that NP_sg Vt_sg", "that NP_pl Vt_pl"]
    RULES[f"VP_{n}"] = [f"Vi_{n}", f"Vt_{n} NP"]


def accepts(text: str, prefix: bool = False) -> bool:
    """Whether the words of `text` form a sentence (or, with `prefix`, the start of one)."""
    words = text.split()

    @cache
    def ends(symbol: str, i: int) -> frozenset[int]:
        if i == len(words) and prefix:
            return frozenset({i})  # out of words: whatever remains can follow
        if symbol not in RULES:
            match = i < len(words) and words[i] in WORDS.get(symbol, symbol).split()
            return frozenset({i + 1} if match else ())
        out = set()
        for rhs in RULES[symbol]:
            positions = {i}
            for part in rhs.split():
                positions = {j for p in positions for j in ends(part, p)}
            out |= positions
        return frozenset(out)

    return len(words) in ends("S", 0)


def grammatical(text: str) -> bool:
    """Whether `text` is whole sentences, then maybe the start of one."""
    *sentences, rest = text.split(".")
    return all(accepts(f"{sentence} .") for sentence in sentences) and accepts(rest, prefix=True)


def test_recogniser():
    assert accepts("the dog that the cats chase sleeps .")
    assert accepts("some farmers near a cat with the dog run .")
    assert not accepts("the dog that the cats chase sleep .")  # agreement
    assert not accepts("the dogs near the cat runs .")
    assert accepts("the dogs near", prefix=True)
    assert not accepts("the dogs near runs", prefix=True)
    assert grammatical("a cat runs . the dogs") and not grammatical("a cat runs . dogs")


@pytest.mark.parametrize(
    ("kwargs", "nesting"), [({}, True), ({"max_depth": 0}, False), ({"recursion_prob": 0.0}, False)]
)
def test_grammar_sequences_are_grammatical(kwargs, nesting):
    task = small("grammar", length=48, **kwargs)
    data = task.splits(seed=0)["train"]
    x, y = data.inputs, data.targets
    assert x.shape == y.shape == (64, 48) and x.dtype == y.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:]) and int(y.min()) >= 0
    assert int(torch.cat([x, y]).max()) < task.vocab_size
    used = set()
    for row_x, row_y in zip(x, y, strict=True):
        text = task.decode(torch.cat([row_x, row_y[-1:]]))
        used |= set(text.split())
        assert grammatical(text)
    assert ("that" in used) == nesting and bool(used & {"near", "behind", "with"}) == nesting


def test_grammar_in_characters_spells_out_grammatical_text():
    words = small("grammar", length=200)
    chars = small("grammar", length=200, unit="char")
    assert chars.vocab_size == len(set(" ".join(VOCAB))) == 24 and words.vocab_size == 34
    data = chars.splits(seed=0)["train"]
    x, y = data.inputs, data.targets
    assert x.shape == y.shape == (64, 200) and torch.equal(y[:, :-1], x[:, 1:])
    assert int(torch.cat([x, y]).min()) >= 0 and int(torch.cat([x, y]).max()) < 24
    for row_x, row_y in zip(x, y, strict=True):
        text = chars.decode(torch.cat([row_x, row_y[-1:]]))
        whole, _, partial = text.rpartition(" ")  # the last word may be cut
        assert grammatical(whole) and "  " not in text
        assert any(word.startswith(partial) for word in VOCAB)
    # the same draws as the word-level task: the characters spell its words
    first_words = words.decode(words.splits(seed=0)["train"].inputs[0]).split()
    assert chars.decode(x[0]).split()[:10] == first_words[:10]


def test_grammar_example():
    task = build_task("grammar", length=12)
    text = "the dog that the cats chase sleeps . some birds sing . a"
    assert task.decode([2, 7, 1, 2, 14, 30, 19, 0, 5, 15, 24, 0, 3]) == text
    assert grammatical(text)
    assert task.seq_len == 12 and task.vocab_size == 34


def sentences_without_recursion() -> dict[str, float]:
    """Every sentence of the rules above with recursion_prob=0 (Det N V . or Det N V Det N .),
    with its probability: each coin and word choice uniform."""

    def phrases(n: str) -> list[tuple[str, float]]:
        dets, nouns = WORDS[f"Det_{n}"].split(), WORDS[f"N_{n}"].split()
        return [(f"{d} {w}", 1 / (len(dets) * len(nouns))) for d in dets for w in nouns]

    objects = [(text, 0.5 * p) for n in ("sg", "pl") for text, p in phrases(n)]
    out: Counter = Counter()
    for n in ("sg", "pl"):
        for subject, p in phrases(n):
            for verb in WORDS[f"Vi_{n}"].split():
                out[f"{subject} {verb} ."] += 0.5 * p * 0.5 / 3
            for verb in WORDS[f"Vt_{n}"].split():
                for obj, q in objects:
                    out[f"{subject} {verb} {obj} ."] += 0.5 * p * 0.5 / 3 * q
    return dict(out)


@pytest.mark.parametrize("kwargs", [{}, {"max_depth": 1, "recursion_prob": 0.6}])
def test_grammar_sentence_probability_agrees_with_the_parser(kwargs):
    """Two computations of one number: the sampler's product of its choices, and the inside
    sum over every derivation (which would count a second derivation if there were one)."""
    task = build_task("grammar", **kwargs)
    rules, uniform = grammar(task.recursion_prob), uniforms(torch.Generator().manual_seed(0))
    nested = 0
    for _ in range(200):
        ids, log_prob = task.sentence(rules, uniform)
        words = [VOCAB[i] for i in ids]
        nested += "that" in words
        assert math.log(task.prefix_probability(words)) == pytest.approx(log_prob, abs=1e-9)
        assert task.prefix_probability(words[:-1], ".") == pytest.approx(math.exp(log_prob))
    assert nested > 20  # relative clauses were covered, where a second derivation could hide


def test_grammar_prefix_probability_is_the_sum_over_continuations():
    task = build_task("grammar", max_depth=2)
    rules, uniform = grammar(task.recursion_prob), uniforms(torch.Generator().manual_seed(1))
    for _ in range(12):  # sentences: every prefix of each, word by word and letter by letter
        words = [VOCAB[i] for i in task.sentence(rules, uniform)[0]]
        for cut in range(len(words)):  # every prefix within the sentence, the whole excluded
            prefix = words[:cut]
            total = sum(task.prefix_probability([*prefix, w]) for w in VOCAB)
            assert total == pytest.approx(task.prefix_probability(prefix))
            word = words[cut]  # character by character through the next word
            for k in range(len(word) + 1):
                letters = {c for w in VOCAB for c in w}
                spelt = sum(task.prefix_probability(prefix, word[:k] + c) for c in letters)
                ended = task.prefix_probability([*prefix, word[:k]]) if k else 0.0
                assert spelt + ended == pytest.approx(task.prefix_probability(prefix, word[:k]))
    assert task.prefix_probability(["dogs"]) == task.prefix_probability([], "x") == 0.0


@pytest.mark.parametrize(("unit", "length"), [("word", 3), ("word", 4), ("char", 9)])
def test_grammar_loss_floor_is_the_exact_conditional_entropy(unit, length):
    """recursion_prob=0: every sentence enumerated, the windows' distribution marginalised."""
    sentences = sentences_without_recursion()
    assert sum(sentences.values()) == pytest.approx(1.0)
    window: Counter = Counter()  # the first length + 1 tokens (a sentence is 4 words or more,
    first: Counter = Counter()  # so at length 4 a window may end on the next one's first word)
    for text, p in sentences.items():
        if unit == "char":
            head, tokens = text[0], tuple((text + " ")[: length + 1])
        else:
            words = text.split()
            head, tokens = words[0], tuple(words[: length + 1])
            if len(tokens) < length + 1:  # the window runs into the next sentence's first word
                for det in ["the", "a", "every", "some", "many"]:
                    n = sum(det in WORDS[f"Det_{m}"].split() for m in ("sg", "pl"))
                    window[(*tokens, det)] += p * n / 6
                first[head] += p
                continue
        window[tokens] += p
        first[head] += p
    entropy = -sum(p * math.log(p) for p in window.values())
    entropy += sum(p * math.log(p) for p in first.values())
    task = build_task("grammar", recursion_prob=0.0, unit=unit, length=length)
    losses = task.best_losses(*task.generate(3000, torch.Generator().manual_seed(0)))
    floor, standard_error = float(losses.mean()), float(losses.std() / math.sqrt(len(losses)))
    assert 0 < standard_error < 0.02 * floor
    assert abs(floor - entropy / length) < 4 * standard_error


# Bad arguments.


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        (
            "relational_games",
            {"problem": "sam"},
            r"problem must be one of same, between, occurs.*got 'sam'",
        ),
        ("relational_games", {"shape_set": "test"}, r"shape_set.*train, heldout.*'test'"),
        ("relational_games", {"test_shape_set": "ood"}, r"test_shape_set.*heldout.*'ood'"),
        ("relational_games", {"cell_size": 4}, r"cell_size must be in \[5, 128\].*got 4"),
        ("arithmetic", {"operation": "division"}, r"operation.*addition, multiplication.*'div"),
        ("arithmetic", {"max_digits": 0}, r"max_digits must be in 1..9.*got 0"),
        ("arithmetic", {"max_digits": 10}, r"max_digits.*got 10"),
        ("grammar", {"length": 0}, r"length must be >= 1, got 0"),
        ("grammar", {"max_depth": -1}, r"max_depth must be >= 0, got -1"),
        ("grammar", {"recursion_prob": 1.5}, r"recursion_prob must be in \[0, 1\], got 1.5"),
        ("grammar", {"unit": "byte"}, r"unit must be one of word, char, got 'byte'"),
    ],
)
def test_invalid_arguments(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_task(name, **kwargs)
