"""DeepMind's relations-game .npz boards (ablations/tasks/relations_game_files.py): the format
read and refused by name on files the tests write, the multi-game `tasks` field, the splits
(disjoint, deterministic in the seed, every out-of-distribution board), the two shipped mini
files, and one cell trained on them through a grid; crafted files refused by name before their
arrays are read; a relative file read beside the grid from any working folder, its SHA-256 in
each cell's record, and a run on a changed file refused before training."""

import hashlib
import io
import shutil
import zipfile

import numpy as np
import pytest
import torch
from grids import STD, tiny_grid

from ablations.grid.spec import SpecError, load_grid
from ablations.results.store import ResultsStore
from ablations.run.runner import run_grid
from ablations.run.train import train_cell
from ablations.tasks import build_task
from ablations.tasks.relations_game_files import DATA, load_boards


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
        ({"images": np.array(7), "labels": np.zeros((2, 1), int),  # 0-d: len() would fail
          "tasks": np.zeros((2, 1), int)}, r"images \(\), labels \(2, 1\).*want images"),
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
    with pytest.raises(ValueError, match="text.npz: not an .npz file"):
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


def write_claiming(path, shape: tuple) -> None:
    """An .npz whose images header claims `shape` (uint8) over 100 bytes of data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": shape}
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("images.npy", header.getvalue() + bytes(100))
        for field in ("labels", "tasks"):
            buffer = io.BytesIO()
            np.save(buffer, np.zeros((2, 1), np.int64))
            archive.writestr(f"{field}.npy", buffer.getvalue())


def test_a_crafted_file_is_refused_by_name_before_its_arrays_are_read(tmp_path, monkeypatch):
    empty = tmp_path / "empty.npz"
    np.savez(empty, images=np.zeros((0, 36, 36, 3), np.uint8), labels=np.zeros((0, 1), int),
             tasks=np.zeros((0, 1), int))  # fmt: skip
    write_claiming(tmp_path / "bomb.npz", (10**7, 36, 36, 3))  # 36 GiB claimed, 1 KB there
    (tmp_path / "hello.npz").write_text("hello")
    objects = tmp_path / "objects.npz"
    np.savez(objects, images=np.array([object()] * 2), labels=np.zeros((2, 1), int),
             tasks=np.zeros((2, 1), int))  # fmt: skip
    refused = {
        empty: r"holds no boards \(images \(0, 36, 36, 3\)\)",
        tmp_path / "bomb.npz": r"its header claims \(10000000, 36, 36, 3\) uint8 "
        r"\(38,880,000,000 bytes\), the archive holds 100",
        tmp_path / "hello.npz": r"not an .npz file",
        objects: "hold pickled objects, which are not read",
    }
    for path, message in refused.items():
        with pytest.raises(ValueError, match=f"^{path}: .*{message}"):
            load_boards(path, -1)
    write_boards(tmp_path / "real.npz", 4)  # arrays that are there, but over the limit
    monkeypatch.setattr("ablations.tasks.relations_game_files.memory_limit", lambda: 10_000)
    with pytest.raises(ValueError, match=r"real.npz: its arrays would take 0.0 GiB .*the limit"):
        load_boards(tmp_path / "real.npz", -1)


def test_a_relative_file_is_read_beside_the_grid_from_any_working_folder(tmp_path, monkeypatch):
    grid_folder, elsewhere = tmp_path / "grid", tmp_path / "elsewhere"
    grid_folder.mkdir()
    elsewhere.mkdir()
    write_boards(grid_folder / "boards.npz", 30, seed=1)
    write_boards(elsewhere / "boards.npz", 30, seed=2)  # same name, other boards: never read
    write_boards(elsewhere / "only_here.npz", 30)
    task = {"name": "relations_game_files", "kwargs": {
        "train_file": "boards.npz", "ood_file": "", "n_train": 16, "n_validation": 8,
        "n_test": 6}}  # fmt: skip
    size = {"label": "s", "d_model": 16, "n_layers": 1}
    path = tiny_grid(grid_folder, tasks=[task], sizes=[size], mechanisms=[STD], seeds=[0],
                     training={"steps": 2, "eval_every": 2})  # fmt: skip
    digest = hashlib.sha256((grid_folder / "boards.npz").read_bytes()).hexdigest()
    for cwd in (elsewhere, grid_folder):  # one grid, two working folders: one cell, one file
        monkeypatch.chdir(cwd)
        spec = load_grid(path)
        assert spec.cells[0].build_task().data_files() == [grid_folder / "boards.npz"]
        run_grid(spec, workers=1, out=io.StringIO())
        (row,) = ResultsStore(spec.store, readonly=True).rows()
        assert row["status"] == "done"
        assert row["environment"]["data"] == {str(grid_folder / "boards.npz"): digest}
        assert row["config"]["task_kwargs"]["train_file"] == "boards.npz"  # its key unchanged
    with pytest.raises(SpecError, match=r"only_here.npz: no such file \(a relative path is "
                       r"looked up beside the grid file, then in"):  # fmt: skip
        load_grid(path, ["tasks[0].kwargs.train_file='only_here.npz'"])
    shutil.copy(elsewhere / "boards.npz", grid_folder / "boards.npz")  # the data changed
    spec = load_grid(path, ["seeds=[0, 1]"])
    with pytest.raises(SpecError) as err:
        run_grid(spec, workers=1, out=io.StringIO())
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: cell ")
    assert f"trained on the data files {{boards.npz: {digest[:12]}}}, this run reads" in message
    assert len(list(ResultsStore(spec.store, readonly=True).rows())) == 1  # nothing trained
