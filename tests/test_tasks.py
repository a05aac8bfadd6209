"""The offline synthetic tasks in `ablations.tasks`: registry, determinism, labels, balance."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from ablations.tasks import IGNORE_INDEX, KINDS, build_task, list_tasks, task_arguments
from ablations.tasks.match_pattern import PATTERNS

SMALL = {"n_train": 64, "n_validation": 16, "n_test": 16}
CLASSIFICATION = ["match_pattern", "same_pair", "contains_set", "count_compare"]
LANGUAGE_MODEL = ["mqar", "copy", "sort", "grammar"]
OTHER_KINDS = ["arithmetic", "relational_games", "relations_game_files", "shakespeare"]  # elsewhere


def small(name: str, **kwargs):
    return build_task(name, **SMALL, **kwargs)


def test_all_tasks_registered():
    assert list_tasks() == sorted(CLASSIFICATION + LANGUAGE_MODEL + OTHER_KINDS)


@pytest.mark.parametrize("name", CLASSIFICATION + LANGUAGE_MODEL)
def test_splits_shapes_and_vocab(name):
    task = small(name)
    assert task.kind in KINDS
    data = task.splits(seed=0)
    assert set(data) == {"train", "validation", "test"}
    for split, n in [("train", 64), ("validation", 16), ("test", 16)]:
        inputs, targets = data[split].inputs, data[split].targets
        assert len(data[split]) == n
        assert inputs.shape == (n, task.seq_len) and inputs.dtype == torch.long
        assert int(inputs.min()) >= 0 and int(inputs.max()) < task.vocab_size
        x, y = data[split][0]
        assert x.shape == (task.seq_len,)
        if task.kind == "classification":
            assert targets.shape == (n,)
            assert set(targets.tolist()) <= set(range(task.num_classes))
        else:
            assert targets.shape == (n, task.seq_len)
            scored = targets[targets != IGNORE_INDEX]
            assert len(scored) > 0 and int(scored.min()) >= 0
            assert int(scored.max()) < task.vocab_size


@pytest.mark.parametrize("name", CLASSIFICATION + LANGUAGE_MODEL)
def test_deterministic_in_seed(name):
    a, b, c = (small(name).splits(seed) for seed in (3, 3, 4))
    for split in a:
        assert torch.equal(a[split].inputs, b[split].inputs)
        assert torch.equal(a[split].targets, b[split].targets)
        assert not torch.equal(a[split].inputs, c[split].inputs)
    assert not torch.equal(a["train"].inputs[:16], a["validation"].inputs)


@pytest.mark.parametrize("name", CLASSIFICATION)
def test_classes_balanced(name):
    for split in small(name).splits(seed=1).values():
        counts = Counter(split.targets.tolist())
        assert counts[0] == counts[1] == len(split) // 2


# Independent pure-Python recomputations of each label.


def pattern_of(triple: list[int]) -> str:
    a, b, c = triple
    if a == b == c:
        return "AAA"
    if a == b:
        return "AAB"
    if a == c:
        return "ABA"
    if b == c:
        return "ABB"
    return "ABC"


def test_match_pattern_labels():
    data = small("match_pattern", vocab_size=10).splits(seed=0)["train"]
    seen = set()
    for x, y in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
        first, second = pattern_of(x[:3]), pattern_of(x[3:])
        seen |= {first, second}
        assert y == int(first == second)
        assert not set(x[:3]) & set(x[3:])  # fresh objects in the second triple
    assert seen == set(PATTERNS)


def test_same_pair_labels():
    data = small("same_pair", vocab_size=5).splits(seed=0)["train"]
    for (a, b), y in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
        assert y == int(a == b)


def test_contains_set_labels():
    task = small("contains_set", vocab_size=12, set_size=3, context_len=6)
    data = task.splits(seed=0)["train"]
    for x, y in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
        query, sep, context = x[:3], x[3], x[4:]
        assert sep == task.sep and len(set(query)) == 3 and task.sep not in context
        assert y == int(all(q in context for q in query))
        assert sum(q in context for q in query) >= 2  # negatives miss exactly one


def test_count_compare_labels():
    data = small("count_compare", seq_len=7).splits(seed=0)["train"]
    for x, y in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
        assert y == int(x.count(4) > x.count(2))


def test_mqar_targets():
    task = small("mqar", vocab_size=32, seq_len=24, num_kv_pairs=3)
    data = task.splits(seed=0)["train"]
    for x, t in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
        keys, values = x[0:6:2], x[1:6:2]
        assert len(set(keys)) == 3 and all(1 <= k < 16 for k in keys)
        assert all(16 <= v < 32 for v in values)
        memory = dict(zip(keys, values, strict=True))
        queried = [x[p] for p, v in enumerate(t) if v != IGNORE_INDEX]
        assert sorted(queried) == sorted(keys)  # each key queried exactly once
        for p, v in enumerate(t):
            if v != IGNORE_INDEX:
                assert p >= 6 and v == memory[x[p]]
                if p + 1 < len(x):
                    assert x[p + 1] == v  # the value follows its query in the stream


@pytest.mark.parametrize("name", ["copy", "sort"])
def test_copy_and_sort_targets(name):
    task = small(name, vocab_size=6, length=5)
    data = task.splits(seed=0)["train"]
    for x, t in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
        source = x[:5]
        assert x[5] == task.sep and task.sep not in source
        answer = source if name == "copy" else sorted(source)
        assert t == [IGNORE_INDEX] * 5 + answer
        assert x[6:] == answer[:-1]


def test_docstring_examples_agree_with_recomputation():
    assert pattern_of([17, 3, 17]) == pattern_of([42, 9, 42]) == "ABA"  # match_pattern: 1
    query, context = [4, 11, 2], [9, 2, 0, 4, 13, 7, 11, 5]  # contains_set: 1
    assert all(q in context for q in query)
    digits = [4, 1, 2, 4, 9, 0, 4, 7]  # count_compare: 1
    assert digits.count(4) > digits.count(2)


# Registry errors.


def test_unknown_task_name():
    with pytest.raises(ValueError, match=r"unknown task: 'match_patern'.*'match_pattern'.*mqar"):
        build_task("match_patern")


def test_unknown_task_argument():
    with pytest.raises(ValueError, match=r"'num_kv_pair'.*'num_kv_pairs'.*seq_len"):
        build_task("mqar", num_kv_pair=4)
    assert "vocab_size" in task_arguments("same_pair")


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("match_pattern", {"vocab_size": 5}),
        ("mqar", {"seq_len": 8, "num_kv_pairs": 4}),
        ("contains_set", {"set_size": 5, "context_len": 3}),
        ("same_pair", {"n_train": 0}),
    ],
)
def test_invalid_arguments(name, kwargs):
    with pytest.raises(ValueError):
        build_task(name, **kwargs)


def test_duplicate_registration():
    from ablations.tasks.registry import register_task
    from ablations.tasks.same_pair import SamePair

    with pytest.raises(ValueError, match="already registered"):
        register_task("same_pair")(SamePair)


def test_match_pattern_with_fresh_object_vectors():
    task = small("match_pattern", objects="vectors", object_dim=8)
    assert task.input_dim == 8 and small("match_pattern").input_dim is None
    splits = task.splits(seed=0)
    data = splits["train"]
    assert data.inputs.shape == (len(data), 6, 8) and data.inputs.dtype == torch.float32
    seen = set()
    for x, y in zip(data.inputs, data.targets.tolist(), strict=True):
        # objects: the distinct rows, in order of first appearance; the pattern from their ids
        rows = [tuple(v.tolist()) for v in x]
        ids = [sorted(set(rows), key=rows.index).index(r) for r in rows]
        first, second = pattern_of(ids[:3]), pattern_of(ids[3:])
        seen |= {first, second}
        assert y == int(first == second)
        assert not set(rows[:3]) & set(rows[3:])  # fresh objects in the second triple
    assert seen == set(PATTERNS)
    # fresh for every example: no object vector appears in two examples
    objects = {tuple(v.tolist()) for x in data.inputs for v in x}
    assert len(objects) == sum(len({tuple(v.tolist()) for v in x}) for x in data.inputs)
    with pytest.raises(ValueError, match=r"objects must be one of tokens, vectors; got 'vector'"):
        build_task("match_pattern", objects="vector")
