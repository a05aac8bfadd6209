"""DeepMind's relations-game .npz boards (ablations/tasks/relations_game_files.py): the format
read and refused by name on files the tests write, the multi-game `tasks` field, the splits
(disjoint, deterministic in the seed, every out-of-distribution board), the two shipped mini
files, and one cell trained on them through a grid."""

import numpy as np
import pytest
import torch
from grids import STD, tiny_grid

from ablations.spec import SpecError, load_grid
from ablations.tasks import build_task
from ablations.tasks.relations_game_files import DATA, load_boards
from ablations.train import train_cell


def write_boards(path, n: int, games=(0,), size: int = 36, seed: int = 0) -> None:
    """`n` random boards per game: a board's label is 1 where its first pixel is bright."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 193, (n * len(games), size, size, 3), dtype=np.int64)
    labels = (images[:, 0, 0, :1] > 96).astype(np.int64)
    tasks = np.repeat(np.asarray(games, dtype=np.int64), n)[:, None]
    np.savez(path, images=images, labels=labels, tasks=tasks)


def test_splits_are_disjoint_deterministic_and_scaled(tmp_path):
    write_boards(tmp_path / "train.npz", 40)
    write_boards(tmp_path / "ood.npz", 7, seed=1)
    files = {"train_file": str(tmp_path / "train.npz"), "ood_file": str(tmp_path / "ood.npz")}
    task = build_task("relations_game_files", **files, n_train=20, n_validation=8, n_test=10)
    splits = task.splits(3)
    assert {k: len(v) for k, v in splits.items()} == {
        "train": 20, "validation": 8, "test": 10, "test_id": 10, "test_ood": 7,
    }  # fmt: skip
    assert splits["train"].inputs.shape[1:] == task.image_shape == (3, 36, 36)
    assert splits["train"].inputs.dtype == torch.float32
    assert splits["train"].inputs.min() >= 0 and splits["train"].inputs.max() <= 192 / 255
    rows = torch.cat([splits[k].inputs.flatten(1) for k in ("train", "validation", "test")])
    assert len(torch.unique(rows, dim=0)) == 38  # no board in two splits
    again = task.splits(3)
    assert all(torch.equal(splits[k].inputs, again[k].inputs) for k in splits)
    assert not torch.equal(task.splits(4)["train"].inputs, splits["train"].inputs)
    raw = np.load(tmp_path / "train.npz")
    first = torch.from_numpy(raw["images"][0]).permute(2, 0, 1).float() / 255
    assert any(torch.equal(first, board) for board in rows.view(-1, 3, 36, 36))
    label = int(raw["labels"][0, 0])  # each board keeps its own label
    (where,) = [i for i, board in enumerate(rows.view(-1, 3, 36, 36)) if torch.equal(first, board)]
    targets = torch.cat([splits[k].targets for k in ("train", "validation", "test")])
    assert int(targets[where]) == label


def test_a_multi_game_file_keeps_the_game_asked_for(tmp_path):
    write_boards(tmp_path / "games.npz", 10, games=(0, 3))
    both = build_task("relations_game_files", train_file=str(tmp_path / "games.npz"),
                      ood_file="", n_train=12, n_validation=4, n_test=4)  # fmt: skip
    assert "test_ood" not in both.splits(0)
    one = dict(train_file=str(tmp_path / "games.npz"), ood_file="", n_validation=2, n_test=2)
    assert len(build_task("relations_game_files", game=3, n_train=6, **one).splits(0)["train"]) == 6
    with pytest.raises(ValueError, match="has 10 boards of game 3"):
        build_task("relations_game_files", game=3, n_train=7, **one)
    with pytest.raises(ValueError, match=r"no board of game 5 \(games: \[0, 3\]\)"):
        build_task("relations_game_files", game=5, n_train=1, **one)


@pytest.mark.parametrize(
    "content, message",
    [
        ({"images": np.zeros((2, 36, 36, 3), int), "labels": np.zeros((2, 1), int)},
         r"lacks the fields \['tasks'\]"),
        ({"images": np.zeros((2, 36, 36), int), "labels": np.zeros((2, 1), int),
          "tasks": np.zeros((2, 1), int)}, "want images \\(n, H, W, 3\\)"),
        ({"images": np.full((2, 36, 36, 3), 300), "labels": np.zeros((2, 1), int),
          "tasks": np.zeros((2, 1), int)}, r"integers in \[0, 255\]"),
        ({"images": np.zeros((2, 36, 36, 3), int), "labels": np.full((2, 1), 2),
          "tasks": np.zeros((2, 1), int)}, "labels must be 0 or 1"),
    ],
)  # fmt: skip
def test_a_file_of_another_format_is_refused_by_name(tmp_path, content, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **content)
    with pytest.raises(ValueError, match=message):
        build_task("relations_game_files", train_file=str(path), ood_file="", n_train=1,
                   n_validation=1, n_test=1)  # fmt: skip
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="not a relations-game .npz file"):
        load_boards(tmp_path / "text.npz", -1)


def test_the_shipped_mini_files_and_a_grid_cell(tmp_path):
    pixels, labels = load_boards(DATA / "mini_between_hexos.npz", -1)
    assert pixels.shape == (5000, 3, 36, 36) and pixels.dtype == torch.uint8
    assert set(labels.tolist()) == {0, 1}
    task = {"name": "relations_game_files", "kwargs": {"n_train": 64, "n_validation": 32,
                                                       "n_test": 32}}  # fmt: skip
    size = {"label": "s", "d_model": 16, "n_layers": 1}
    path = tiny_grid(tmp_path, tasks=[task], sizes=[size], mechanisms=[STD], seeds=[0],
                     training={"steps": 4, "eval_every": 2})  # fmt: skip
    (cell,) = load_grid(path).cells
    result = train_cell(cell)
    assert result.status == "done"
    assert {"test_id_acc", "test_ood_acc"} <= set(result.metrics)
    with pytest.raises(SpecError, match="has 5000 boards"):
        load_grid(path, ["tasks[0].kwargs.n_train=5000"])
