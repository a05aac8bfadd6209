"""A cell's result depends on its config and recorded inputs alone: torch's global state is put
back to its defaults before every cell (ablations/run/torch_state.py), a model whose building
changes it fails its cell, and a resume checkpoint is taken only when the data files, plugin
files and torch state it was written from are this run's (ablations/run/resume.py). Runs are
real processes (the CLI, with worker processes) where the state of a process matters."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from grids import STD, tiny_grid
from test_relations_game_files import write_boards
from test_resume import exact

from ablations.grid.spec import load_grid
from ablations.results.store import ResultsStore
from ablations.run import train
from ablations.run.progress import cell_label
from ablations.run.provenance import plugin_record, source_state
from ablations.run.resume import ResumePlan
from ablations.run.torch_state import DEFAULTS, reset_torch_state, torch_state

ROOT = Path(__file__).resolve().parents[1]
TRAINING = {"steps": 30, "eval_every": 10}


@pytest.fixture(autouse=True)
def one_thread():
    """Cells train with one thread here, as a grid's worker does (the results compare)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cli(
    grid: Path, *extra: str, path: Path = ROOT, workers: int = 2
) -> subprocess.CompletedProcess:
    """`attn-zoo ablate run GRID` in a child process with `workers` worker processes (1: a
    thread of the child: where the driver's decision is the point, such as whether to resume);
    `path`: a folder of modules it imports, first on its sys.path (and the workers')."""
    command = [sys.executable, "-m", "ablations.cli", "ablate", "run", str(grid),
               "--workers", str(workers)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(path), str(ROOT)]))}
    result = subprocess.run(
        [*command, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def the_row(grid: Path) -> dict:
    (row,) = ResultsStore(load_grid(grid).store, readonly=True).rows()
    return row


def with_imports(grid: Path, *plugins: Path) -> None:
    """`grid` importing the plugin files `plugins` (its first line)."""
    names = ", ".join(f'"{plugin}"' for plugin in plugins)
    grid.write_text(f"imports = [{names}]\n" + grid.read_text())


def test_a_plugin_that_sets_float64_as_default_trains_no_cell_in_float64(tmp_path):
    """The plugin's float64 default is put back for the cell (with a note): its result is the
    float32 one its store records (the hostile pass: val_loss 0.6506 in float64, 0.8311)."""
    plugin = tmp_path / "float64_default.py"
    plugin.write_text("import torch\n\ntorch.set_default_dtype(torch.float64)\n")
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=TRAINING)
    with_imports(grid, plugin)
    try:
        (cell,) = load_grid(grid).cells  # imports the plugin here too
    finally:
        torch.set_default_dtype(torch.float32)
    result = cli(grid)
    note = "torch's global state put back to its defaults: default_dtype float64 -> float32"
    assert f"note: {cell_label(cell)}: {note}" in result.stdout
    row, reference = the_row(grid), train.train_cell(cell)  # float32, in this process
    assert row["environment"]["dtype"] == "float32"
    assert exact(row["metrics"]) == exact(reference.metrics)
    assert row["curve"] == reference.curve


@pytest.mark.parametrize(
    ("step", "what"),
    [("build_cell_model", "building the cell's model"),  # a mechanism's __init__
     ("evaluate", "training or evaluating the cell")],  # a forward (the hostile pass: unseen)
)  # fmt: skip
def test_a_cell_that_changes_torchs_global_state_fails(tmp_path, monkeypatch, step, what):
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=TRAINING)
    (cell,) = load_grid(grid).cells
    real = getattr(train, step)

    def in_float64(*args, **kwargs):
        torch.set_default_dtype(torch.float64)
        return real(*args, **kwargs)

    monkeypatch.setattr(train, step, in_float64)
    try:
        with pytest.raises(RuntimeError, match=rf"{what} changed .*float32 -> float64.*per tensor"):
            train.train_cell(cell)
    finally:
        torch.set_default_dtype(torch.float32)
    assert torch_state() == DEFAULTS


def planted_checkpoint(grid: Path) -> None:
    """A resume checkpoint of `grid`'s one cell at step 10, from the files as they are now
    (the code and plugins as a run's driver records them), where a killed run would have left
    it."""
    spec = load_grid(grid)
    (cell,) = spec.cells
    points = []
    sources = {"code": source_state(), "plugins": plugin_record(spec.imports)}
    train.train_cell(cell, resume=ResumePlan(every_steps=10, sources=sources),
                     on_checkpoint=lambda step, data: points.append(data))  # fmt: skip
    with ResultsStore(spec.store) as store:
        file = store.resume_path(cell.key)
    file.parent.mkdir()
    file.write_bytes(points[0])


def assert_trained_from_zero(grid: Path, result, changed: str) -> None:
    (cell,) = load_grid(grid).cells
    row, reference = the_row(grid), train.train_cell(cell)  # on the files as they are now
    note = f"note: {cell_label(cell)}: resume checkpoint ignored ({changed} changed since it"
    assert note in result.stdout
    assert "resumed_from_step" not in row["environment"]
    assert exact(row["metrics"]) == exact(reference.metrics)
    assert row["curve"] == reference.curve


def test_a_checkpoint_is_not_resumed_after_its_data_file_changed(tmp_path):
    write_boards(tmp_path / "train.npz", 40)
    files = {"train_file": str(tmp_path / "train.npz")}
    task = {"name": "relations_game_files", "kwargs": {**files, "n_train": 20,
            "n_validation": 8, "n_test": 8}}  # fmt: skip
    size = {"label": "s", "d_model": 16, "n_layers": 1}
    grid = tiny_grid(tmp_path, tasks=[task], sizes=[size], mechanisms=[STD], seeds=[0],
                     training=TRAINING)  # fmt: skip
    planted_checkpoint(grid)
    write_boards(tmp_path / "train.npz", 40, seed=1)  # the same shapes, other boards
    result = cli(grid, "--set", "resume.every_steps=10", workers=1)
    assert_trained_from_zero(grid, result, "its data files")


@pytest.mark.parametrize("edited", ["the plugin", "a helper it imports lazily"])
def test_a_checkpoint_is_not_resumed_after_its_plugin_changed(tmp_path, edited):
    """The plugin file's own edit, and (the hostile pass) an edit of a helper module beside it
    that it imports inside a function (at the first forward, after the plugin was digested),
    which resumed a killed cell and gave cells of both versions one digest."""
    plugin = tmp_path / "helper_plugin.py"
    plugin.write_text(
        "def scale():\n    import lazy_helper_h5\n\n    return lazy_helper_h5.SCALE\n"
    )
    helper = tmp_path / "lazy_helper_h5.py"
    helper.write_text("SCALE = 1.0\n")
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=TRAINING)
    with_imports(grid, plugin)
    planted_checkpoint(grid)
    changed = plugin if edited == "the plugin" else helper
    changed.write_text(changed.read_text() + "SCALE = 2.0  # edited after the kill\n")
    result = cli(grid, "--set", "resume.every_steps=10", workers=1)
    assert_trained_from_zero(grid, result, "the plugin files")


def test_a_checkpoint_is_not_resumed_after_a_module_of_its_plugin_package_changed(
    tmp_path, monkeypatch
):
    """The hostile pass: with ``imports = ["pkg"]`` and the mechanism in pkg/impl.py, an edit
    of impl.py after a SIGKILL resumed the cell from a checkpoint of the old code (only the
    package's __init__.py was digested)."""
    package = tmp_path / "edited_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(f"from {package.name} import impl  # noqa: F401\n")
    (package / "impl.py").write_text("SCALE = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=TRAINING)
    grid.write_text(f'imports = ["{package.name}"]\n' + grid.read_text())
    planted_checkpoint(grid)
    (package / "impl.py").write_text("SCALE = 2.0  # edited after the kill\n")
    result = cli(grid, "--set", "resume.every_steps=10", path=tmp_path, workers=1)
    assert_trained_from_zero(grid, result, "the plugin files")


def test_a_checkpoint_is_not_resumed_after_an_installed_entry_point_plugin_changed(
    tmp_path, monkeypatch
):
    """The hostile pass: a plugin installed through an entry point (group attn_zoo.plugins),
    edited after a SIGKILL, resumed the cell from a checkpoint of its old code, and the cell
    recorded no plugins ({}). Now its package is digested like a grid's imports."""
    site = tmp_path / "site"
    info = site / "ep_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attn_zoo.plugins]\nhelper = ep_helper.impl\n")
    (site / "ep_helper").mkdir()
    (site / "ep_helper" / "__init__.py").write_text("")
    (site / "ep_helper" / "impl.py").write_text("SCALE = 1.0\n")
    (site / "ep_helper" / "maths.py").write_text("ONE = 1\n")  # a module impl does not import
    monkeypatch.syspath_prepend(str(site))  # the record here sees it as the CLI's run does
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=TRAINING)
    planted_checkpoint(grid)
    (site / "ep_helper" / "maths.py").write_text("ONE = 2  # edited after the kill\n")
    result = cli(grid, "--set", "resume.every_steps=10", path=site, workers=1)
    assert_trained_from_zero(grid, result, "the plugin files")
    assert list(the_row(grid)["environment"]["plugins"]) == ["ep_helper (entry point)"]


def test_the_same_inputs_resume_and_another_torch_state_does_not(tmp_path, monkeypatch):
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=TRAINING)
    (cell,) = load_grid(grid).cells
    points = []
    train.train_cell(cell, resume=ResumePlan(every_steps=10),
                     on_checkpoint=lambda step, data: points.append(data))  # fmt: skip
    resumed = train.train_cell(cell, resume=ResumePlan(data=points[0]))
    assert resumed.notes == ["resumed from its checkpoint at step 10"]
    other = {**torch_state(), "deterministic_algorithms": True}  # as if written under it
    with monkeypatch.context() as patch:
        patch.setattr(train, "torch_state", lambda: other)
        patch.setattr(train, "changes", lambda state, put_back=True: [])
        points.clear()
        train.train_cell(cell, resume=ResumePlan(every_steps=10),
                         on_checkpoint=lambda step, data: points.append(data))  # fmt: skip
    ignored = train.train_cell(cell, resume=ResumePlan(data=points[0]))
    assert ignored.notes == [
        "resume checkpoint ignored (torch's global state changed since it was written: "
        "deterministic_algorithms True then, False now); trained from step 0"
    ]
    assert ignored.curve == train.train_cell(cell).curve


def test_a_plugin_that_replaces_a_built_in_name_is_recorded_in_each_cell(tmp_path):
    plugin = tmp_path / "my_standard.py"
    plugin.write_text(
        "from attn_zoo import register_mechanism\n"
        "from attn_zoo.mechanisms.standard import StandardAttention\n\n"
        "@register_mechanism('standard', replace=True)\n"
        "class MyStandard(StandardAttention):\n"
        "    pass\n"
    )
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training={"steps": 4, "eval_every": 2})
    with_imports(grid, plugin)
    cli(grid)  # the plugin is imported in the driver and in each worker
    assert the_row(grid)["environment"]["replaced"] == ["mechanism standard"]


def test_a_checkpoint_of_other_code_is_not_resumed(tmp_path):
    """The hostile pass: after an edit of attn_zoo/mechanisms/standard.py a killed cell
    resumed from its checkpoint: only attn_zoo's version was compared."""
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=TRAINING)
    (cell,) = load_grid(grid).cells
    points, here = [], source_state()
    other = {"code": {"commit": "0" * 40}, "plugins": {}}
    train.train_cell(cell, resume=ResumePlan(every_steps=10, sources=other),
                     on_checkpoint=lambda step, data: points.append(data))  # fmt: skip
    [note] = train.train_cell(cell, resume=ResumePlan(data=points[0])).notes
    assert note.startswith(
        f"resume checkpoint ignored (the code (attn_zoo, ablations) changed since it was "
        f"written: commit {'0' * 40} then, {here['commit']} now"
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
        lambda: setattr(torch.backends, "fp32_precision", "tf32"),
        lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),
        lambda: torch.set_float32_matmul_precision("medium"),
        lambda: torch.use_deterministic_algorithms(True),
        lambda: torch.backends.cuda.enable_flash_sdp(False),  # sdpa on the CPU: 6e-7 off
        lambda: setattr(torch.backends.mkldnn, "enabled", False),
    ],
)
def test_torchs_new_and_legacy_precision_settings_are_read_and_put_back(change):
    """torch's fp32_precision API (what torch recommends) made torch_state's legacy getter
    raise in every cell; both APIs are read and put back, and the legacy getter works after."""
    try:
        change()
        assert reset_torch_state() != []
        assert torch_state() == DEFAULTS
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        reset_torch_state()
