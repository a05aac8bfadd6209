"""Plugin code and data that no import statement names (hostile pass 5): a helper the plugin's
forward loads with ``importlib.import_module``, and a data file it reads, are inputs of a resume
checkpoint like its own file; an edit of either after a kill trains the cell from step 0, an
unchanged one resumes (ablations/grid/plugins.py, ablations/run/resume.py). And (hostile pass 6)
the note of a checkpoint not resumed names exactly the files that changed, were added or are
gone, a checkpoint holding a digest of each. And (hostile pass 7, D8) a helper a forward imports
from a namespace package (a folder without __init__.py) in another folder is digested, named by
its module's own file. Runs are real CLI processes (one thread worker: the decision to resume is
the point), or the training function where only the note is."""

import hashlib
import io
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from grids import STD, tiny_grid
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
from ablations.grid.spec import load_grid
from ablations.run import train
from ablations.run.provenance import plugin_record, source_state
from ablations.run.resume import MAGIC, ResumePlan
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


def outside_grid(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A grid in tmp_path/grid whose plugin imports helper module outside_helper (SCALE = 1.0)
    from tmp_path/lib, a folder on sys.path outside the plugin's and the grid's (its forward
    reads the helper anew with importlib, so that a reference trains on an edit): the grid and
    the helper."""
    lib, folder = tmp_path / "lib", tmp_path / "grid"
    lib.mkdir(), folder.mkdir()
    helper = lib / "outside_helper.py"
    helper.write_text("SCALE = 1.0\n")
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.delitem(sys.modules, "outside_helper", raising=False)
    scale = "importlib.import_module('outside_helper').SCALE"
    mechanism = scaled_plugin(folder, "outside_mech", scale, "import outside_helper  # noqa: F401")
    grid = tiny_grid(folder, mechanisms=[mechanism], seeds=[0], training=TRAINING)
    with_imports(grid, folder / "outside_mech.py")
    return grid, helper


@pytest.mark.slow  # two CLI runs and two trainings: about 15 s here
def test_the_note_names_the_helper_from_another_folder_that_changed(tmp_path, monkeypatch):
    """The hostile pass: a helper the plugin imports from another folder, edited after a kill:
    the checkpoint was rightly not resumed, but its note named the plugin's file, the record
    holding one digest of all its files."""
    grid, helper = outside_grid(tmp_path, monkeypatch)
    planted_checkpoint(grid)
    helper.write_text("SCALE = 0.5  # edited after the kill\n")
    monkeypatch.delitem(sys.modules, "outside_helper")  # the reference trains on the edit
    result = cli(grid, "--set", "resume.every_steps=10", path=helper.parent, workers=1)
    assert_trained_from_zero(grid, result, "the plugin files")
    (note,) = [line for line in result.stdout.splitlines() if "checkpoint ignored" in line]
    assert f"changed since it was written: {helper.resolve()} (" in note
    assert "outside_mech" not in note


def resumed_notes(grid: Path, edit, checkpoint=lambda data: data) -> list[str]:
    """The notes of `grid`'s one cell trained in this process from its step-10 checkpoint
    (made `checkpoint(data)`) after `edit()`, each time with the code and plugins as a run's
    driver records them."""
    spec = load_grid(grid)
    (cell,) = spec.cells

    def plan(**given) -> ResumePlan:
        return ResumePlan(sources={"code": source_state(),
                                   "plugins": plugin_record(spec.imports)}, **given)  # fmt: skip

    points = []
    train.train_cell(cell, resume=plan(every_steps=10),
                     on_checkpoint=lambda step, data: points.append(data))  # fmt: skip
    edit()
    return train.train_cell(cell, resume=plan(data=checkpoint(points[0]))).notes


def test_the_note_names_a_changed_file_from_another_folder_by_its_absolute_path(
    tmp_path, monkeypatch
):
    grid, helper = outside_grid(tmp_path, monkeypatch)
    (note,) = resumed_notes(grid, lambda: helper.write_text("SCALE = 0.5\n"))
    assert note.startswith(
        f"resume checkpoint ignored (the plugin files changed since it was written: "
        f"{helper.resolve()} ("
    )
    assert "outside_mech" not in note and note.count(" then, ") == 1


def test_the_note_names_a_changed_file_under_the_grids_folder_by_its_relative_path(tmp_path):
    (tmp_path / "plugins").mkdir()
    mechanism = scaled_plugin(tmp_path / "plugins", "relative_mech", "1.0")
    grid = tiny_grid(tmp_path, mechanisms=[mechanism], seeds=[0], training=TRAINING)
    plugin = tmp_path / "plugins" / "relative_mech.py"
    with_imports(grid, plugin)
    (note,) = resumed_notes(grid, lambda: plugin.write_text(plugin.read_text() + "# edited\n"))
    assert "changed since it was written: plugins/relative_mech.py (" in note
    assert str(tmp_path) not in note and note.count(" then, ") == 1


def test_the_note_names_the_files_of_a_plugin_package_added_and_gone(tmp_path, monkeypatch):
    package = tmp_path / "files_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "old.py").write_text("ONE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=TRAINING)
    grid.write_text(f'imports = ["{package.name}"]\n' + grid.read_text())

    def edit() -> None:
        (package / "old.py").unlink()
        (package / "new.py").write_text("ONE = 1\n")

    (note,) = resumed_notes(grid, edit)
    assert re.search(r"written: files_pkg/old\.py \([0-9a-f]{12} then, gone now\), "
                     r"files_pkg/new\.py \(added\)\)", note), note  # fmt: skip


def without_file_digests(data: bytes) -> bytes:
    """Checkpoint `data` as written before a digest per plugin file: its inputs without "files"
    (with "loaded", the files loaded from the plugins' folders: none here)."""
    payload = torch.load(io.BytesIO(data[len(MAGIC) + 32 :]), weights_only=True)
    inputs = json.loads(payload["inputs"])
    inputs.pop("files", None)
    payload["inputs"] = json.dumps({**inputs, "loaded": {}}, sort_keys=True)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return MAGIC + hashlib.sha256(buffer.getvalue()).digest() + buffer.getvalue()


def test_a_checkpoint_from_before_per_file_digests_resumes_unchanged_and_refuses_a_change(
    tmp_path, monkeypatch
):
    grid, helper = outside_grid(tmp_path, monkeypatch)
    old = without_file_digests
    assert resumed_notes(grid, lambda: None, old) == ["resumed from its checkpoint at step 10"]
    (note,) = resumed_notes(grid, lambda: helper.write_text("SCALE = 0.5\n"), old)
    assert "changed since it was written: {outside_mech.py: " in note
    assert "(the checkpoint predates per-file digests: which of the plugins' files" in note


def namespace_helper(tmp_path: Path, monkeypatch, namespace: str) -> tuple[Path, Path]:
    """Module `namespace`.bias (SCALE = 1.0) in tmp_path/shared/`namespace`, a namespace
    package (no __init__.py) on sys.path, beside an unrelated module of it: the folder that
    holds the grid (tmp_path/grid) and the helper."""
    shared, folder = tmp_path / "shared", tmp_path / "grid"
    (shared / namespace).mkdir(parents=True), folder.mkdir()
    helper = shared / namespace / "bias.py"
    helper.write_text("SCALE = 1.0\n")
    (shared / namespace / "unrelated.py").write_text("UNUSED = 1\n")
    monkeypatch.syspath_prepend(str(shared))
    for module in (namespace, f"{namespace}.bias"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return folder, helper


@pytest.mark.parametrize(
    "statement",
    ["from {ns}.bias import SCALE", "import {ns}.bias", "from {ns} import bias, unknown"],
)
def test_a_helper_imported_lazily_from_a_namespace_package_is_digested(
    tmp_path, monkeypatch, statement
):
    """The seventh pass: the namespace package had no file, so its module was never digested
    and a checkpoint resumed across its edit. Only the module named is its code."""
    folder, helper = namespace_helper(tmp_path, monkeypatch, "ns_lazy")
    plugin = folder / "ns_lazy_mech.py"
    plugin.write_text(f"def forward():\n    {statement.format(ns='ns_lazy')}\n")
    (name,) = resolve([str(plugin)])
    assert plugin_files(name) == [str(plugin.resolve()), str(helper.resolve())]


def test_a_namespace_helpers_relative_imports_are_digested(tmp_path, monkeypatch):
    folder, helper = namespace_helper(tmp_path, monkeypatch, "ns_relative")
    helper.write_text("from .scale_of import SCALE\n")
    (helper.parent / "scale_of.py").write_text("SCALE = 1.0\n")
    plugin = folder / "ns_relative_mech.py"
    plugin.write_text("def forward():\n    from ns_relative.bias import SCALE\n")
    (name,) = resolve([str(plugin)])
    assert plugin_files(name)[1:] == [
        str(helper.resolve()),
        str(helper.parent.resolve() / "scale_of.py"),
    ]


@pytest.mark.slow  # a CLI run and two trainings: 38 s on a loaded machine
def test_an_edit_of_a_namespace_helper_imported_lazily_trains_from_step_0(tmp_path, monkeypatch):
    """The seventh pass, end to end: after a kill at step 400 the helper was edited (SCALE 1.0
    -> 3.0) and the cell resumed, its result neither the old code's nor the new's."""
    folder, helper = namespace_helper(tmp_path, monkeypatch, "ns_edited")
    head = "def scale():\n    from ns_edited.bias import SCALE\n\n    return SCALE\n"
    mechanism = scaled_plugin(folder, "ns_edited_mech", "scale()", head)
    grid = tiny_grid(folder, mechanisms=[mechanism], seeds=[0], training=TRAINING)
    with_imports(grid, folder / "ns_edited_mech.py")
    planted_checkpoint(grid)
    helper.write_text("SCALE = 0.5  # edited after the kill\n")
    monkeypatch.delitem(sys.modules, "ns_edited.bias")  # the reference trains on the edit
    result = cli(grid, "--set", "resume.every_steps=10", path=helper.parent.parent, workers=1)
    assert_trained_from_zero(grid, result, "the plugin files")
    (note,) = [line for line in result.stdout.splitlines() if "checkpoint ignored" in line]
    assert f"changed since it was written: {helper.resolve()} (" in note
