"""Plugin code and data that no import statement names (hostile pass 5): a helper the plugin's
forward loads with ``importlib.import_module``, and a data file it reads, are inputs of a resume
checkpoint like its own file; an edit of either after a kill trains the cell from step 0, an
unchanged one resumes (ablations/grid/plugins.py, ablations/run/resume.py). Runs are real CLI
processes (one thread worker: the decision to resume is the point)."""

import re
import sys
from pathlib import Path

import pytest
from grids import tiny_grid
from test_cell_inputs import (
    TRAINING,
    assert_trained_from_zero,
    cli,
    one_thread,  # noqa: F401  (autouse: cells train with one thread here, as the CLI's worker)
    planted_checkpoint,
    the_row,
    with_imports,
)

from ablations.grid.plugins import import_plugins, plugin_files, resolve
from attn_zoo.registry import PluginError


def scaled_plugin(folder: Path, name: str, scale: str, head: str = "") -> dict:
    """A plugin file in `folder` registering mechanism `name`: standard attention times
    `scale` (an expression evaluated at every forward, after the lines `head`); the grid's
    mechanism entry."""
    (folder / f"{name}.py").write_text(
        "import importlib\nimport json\nimport pathlib\n\n"
        "import attn_zoo\n"
        "from attn_zoo.mechanisms.standard import StandardAttention\n"
        f"{head}\n\n"
        f"@attn_zoo.register_mechanism({name!r})\n"
        "class Scaled(StandardAttention):\n"
        "    def forward(self, x, *args, **kwargs):\n"
        f"        return super().forward(x, *args, **kwargs) * {scale}\n"
    )
    return {"label": "scaled", "name": name, "kwargs": {"n_heads": 2}}


def dynamic_grid(tmp_path: Path, monkeypatch, helper: str) -> Path:
    """A grid whose plugin's forward loads module `helper` (beside it, SCALE = 1.0) with
    importlib.import_module, as the hostile pass's did; its checkpoint at step 10 planted."""
    (tmp_path / f"{helper}.py").write_text("SCALE = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # where importlib finds it, as the CLI's does
    monkeypatch.delitem(sys.modules, helper, raising=False)
    mechanism = scaled_plugin(tmp_path, f"{helper}_mech",
                              f"importlib.import_module({helper!r}).SCALE")  # fmt: skip
    grid = tiny_grid(tmp_path, mechanisms=[mechanism], seeds=[0], training=TRAINING)
    with_imports(grid, tmp_path / f"{helper}_mech.py")
    planted_checkpoint(grid)
    return grid


def test_an_edit_of_a_helper_loaded_with_importlib_trains_from_step_0(tmp_path, monkeypatch):
    """The hostile pass: SCALE 1.0 -> 0.0 in the helper after a SIGKILL, and the cell resumed
    its step-20 checkpoint (mixed training); only the plugin's own file was digested."""
    grid = dynamic_grid(tmp_path, monkeypatch, "scale_dyn_edited")
    helper = tmp_path / "scale_dyn_edited.py"
    helper.write_text("SCALE = 0.5  # edited after the kill\n")
    monkeypatch.delitem(sys.modules, "scale_dyn_edited")  # the reference trains on the edit
    result = cli(grid, "--set", "resume.every_steps=10", path=tmp_path, workers=1)
    assert_trained_from_zero(grid, result, "the plugin files")
    assert "scale_dyn_edited.py (" in result.stdout  # the note names the file


def test_an_unchanged_helper_loaded_with_importlib_resumes(tmp_path, monkeypatch):
    grid = dynamic_grid(tmp_path, monkeypatch, "scale_dyn_same")
    result = cli(grid, "--set", "resume.every_steps=10", path=tmp_path, workers=1)
    assert "resumed from its checkpoint at step 10" in result.stdout
    environment = the_row(grid)["environment"]
    assert environment["resumed_from_step"] == 10
    helper = str((tmp_path / "scale_dyn_same.py").resolve())
    assert helper in environment["loaded_plugin_files"]  # the cell records what it loaded


def test_an_edit_of_a_data_file_a_plugin_declares_trains_from_step_0(tmp_path):
    """The hostile pass's variant: the plugin reads settings.json beside it at every forward;
    declared in ATTN_ZOO_FILES, it is digested with the plugin's code."""
    settings = tmp_path / "settings_dyn.json"
    settings.write_text('{"scale": 1.0}\n')
    reads = "json.loads((pathlib.Path(__file__).parent / 'settings_dyn.json').read_text())"
    mechanism = scaled_plugin(tmp_path, "json_dyn_mech", f"{reads}['scale']",
                              head='ATTN_ZOO_FILES = ["settings_dyn.json"]')  # fmt: skip
    grid = tiny_grid(tmp_path, mechanisms=[mechanism], seeds=[0], training=TRAINING)
    with_imports(grid, tmp_path / "json_dyn_mech.py")
    planted_checkpoint(grid)
    settings.write_text('{"scale": 0.5, "edited": "after the kill"}\n')
    result = cli(grid, "--set", "resume.every_steps=10", path=tmp_path, workers=1)
    assert_trained_from_zero(grid, result, "the plugin files")


@pytest.mark.parametrize(
    ("declared", "said"),
    [
        ('["missing.json"]', "names 'missing.json', which is not a file in"),
        ('"settings.json"', "= 'settings.json' is not a list of file names"),
    ],
)
def test_declared_data_files_that_are_not_a_list_of_files_are_refused_by_name(
    tmp_path, declared, said
):
    (tmp_path / "settings.json").write_text("{}\n")
    plugin = tmp_path / f"bad_files_{len(declared)}.py"
    plugin.write_text(f"ATTN_ZOO_FILES = {declared}\n")
    (name,) = resolve([str(plugin)])
    import_plugins([name])
    with pytest.raises(PluginError, match=re.escape(said)) as error:
        plugin_files(name)
    assert plugin.name in str(error.value)
