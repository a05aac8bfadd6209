"""Plugins as they fail (in real processes where processes matter): a plugin that fails
half-way leaves nothing registered (importing it again raises its own error, not "already
registered"), a plugin's output stays off a command's stdout, a folder named attn_zoo that
hides the package is named with the fix, and so is a plugin whose name sys.path finds
elsewhere than the file beside the grid."""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from grids import SAME_PAIR, STD, assert_refused, small, tiny_grid

from ablations.grid.spec import load_grid

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HALF_WAY = """
import attn_zoo as az
from dataclasses import dataclass
from ablations.tasks.registry import register_task
from ablations.tasks.same_pair import SamePair
from attn_zoo.mechanisms.standard import StandardAttention
from attn_zoo.symbols.registry import SYMBOL_RETRIEVERS, register_symbol_retriever

@az.register_mechanism("half_mine")
class Mine(StandardAttention):
    pass

@az.register_mechanism("standard", replace=True)
class NotStandard(StandardAttention):
    pass

Retriever = SYMBOL_RETRIEVERS["position_relative"]
register_symbol_retriever("half_retriever")(type("R", (Retriever,), {}))
register_task("half_task")(dataclass(frozen=True)(type("T", (SamePair,), {})))
raise RuntimeError("my bug")
"""


def run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_plugin_that_fails_half_way_registers_nothing_and_fails_the_same_way_again(tmp_path):
    (tmp_path / "half.py").write_text(HALF_WAY)
    (tmp_path / "half_pkg").mkdir()  # a dotted module: finding it imports (and fails) its parent
    (tmp_path / "half_pkg" / "__init__.py").write_text(HALF_WAY)
    (tmp_path / "half_pkg" / "mod.py").write_text("")
    code = textwrap.dedent(f"""
        import attn_zoo as az
        from ablations.grid.plugins import import_plugins
        from ablations.tasks.registry import list_tasks
        from attn_zoo.mechanisms.registry import mechanism_class
        from attn_zoo.mechanisms.standard import StandardAttention
        from attn_zoo.registry import PluginError, replaced_names
        from attn_zoo.symbols.registry import list_symbol_retrievers

        for plugin in [{str(tmp_path / "half.py")!r}] * 2 + ["half_pkg.mod"] * 2:
            try:
                import_plugins([plugin])
            except PluginError as err:
                print(err)
        names = [*az.list_mechanisms(), *list_tasks(), *list_symbol_retrievers()]
        assert not [n for n in names if n.startswith("half")], names
        assert mechanism_class("standard") is StandardAttention
        assert replaced_names() == [], replaced_names()
    """)
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    errors = result.stdout.strip().splitlines()
    assert len(errors) == 4 and all(e.endswith("cannot be imported: RuntimeError: my bug")
                                    for e in errors), errors  # fmt: skip


def test_an_installed_plugin_that_fails_half_way_fails_the_same_way_again(tmp_path):
    site = tmp_path / "site"
    info = site / "half_pkg-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "half_plugin.py").write_text(HALF_WAY)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: half-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attn_zoo.plugins]\nhalf = half_plugin\n")
    code = textwrap.dedent("""
        import attn_zoo as az
        from attn_zoo.registry import PluginError

        for _ in range(2):
            try:
                az.list_mechanisms()
            except PluginError as err:
                print(err)
    """)
    result = run(
        [sys.executable, "-c", code], tmp_path, {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}
    )
    assert result.returncode == 0, result.stderr
    errors = result.stdout.strip().splitlines()
    assert len(errors) == 2 and all("RuntimeError: my bug" in e for e in errors), errors


SEARCH = """
[search]
trials = 2
space."training.lr" = { low = 1e-4, high = 3e-2, log = true }
"""


def loud_grid(tmp_path: Path, search: bool = False) -> Path:
    """tmp_path/grid.toml: one cell of a tiny task (with `search`: a search of two trials)."""
    path = tiny_grid(tmp_path, name="loud", seeds=[0], tasks=[small(SAME_PAIR, 64, 16)],
                     mechanisms=[STD], training={"steps": 4, "eval_every": 2})  # fmt: skip
    if search:
        path.write_text(path.read_text() + SEARCH)
    return path


LOUD = """
import os, subprocess, sys
print("hello from the plugin")
os.system("echo noisy from os.system")
subprocess.run([sys.executable, "-c", "print('noisy from a subprocess')"])
"""


def test_a_plugins_output_stays_off_the_lines_ablate_best_prints(tmp_path):
    """`ablate best` prints --set lines a user copies: a plugin printing as it is imported
    wrote among them, and so did os.system and a subprocess (file descriptor 1) after
    Python's prints went to stderr."""
    loud_grid(tmp_path, search=True)
    (tmp_path / "loud.py").write_text(LOUD)
    result = run([str(BIN / "attn-zoo"), "ablate", "best", "grid.toml", "--import", "loud.py"],
                 tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    for line in ("hello from the plugin", "noisy from os.system", "noisy from a subprocess"):
        assert line in result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines and all(line.startswith(("#", "--set ")) for line in lines), lines


PLUGIN = """
import attn_zoo as az
from attn_zoo.mechanisms.standard import StandardAttention

@az.register_mechanism("shadowed_mine")
class Mine(StandardAttention):
    pass
"""


def test_a_folder_named_attn_zoo_in_the_working_folder_is_named_with_the_fix(tmp_path):
    """`python -m ablations.cli` puts the working folder first on sys.path: a folder there
    named attn_zoo (a clone of the repository, a results folder) becomes `attn_zoo` (a
    namespace package, its submodules still found through the editable install), and the
    plugin's `az.register_mechanism` was an AttributeError naming neither."""
    (tmp_path / "attn_zoo").mkdir()
    (tmp_path / "mine.py").write_text(PLUGIN)
    loud_grid(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [sys.executable, "-c", "import attn_zoo, ablations; print(attn_zoo.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if probe.stdout.strip() != "None":
        pytest.skip("this install of attn_zoo is not hidden by a namespace folder")
    args = [sys.executable, "-m", "ablations.cli", "ablate", "status", "grid.toml"]
    result = subprocess.run([*args, "--import", "mine.py"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert str(tmp_path / "attn_zoo") in result.stderr and "rename" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    shutil.rmtree(tmp_path / "attn_zoo")  # the fix
    fixed = subprocess.run([*args, "--import", "mine.py"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr


def test_a_plugin_named_after_a_module_on_sys_path_with_its_file_beside_the_grid_is_refused(
    tmp_path,
):
    """A colorsys.py beside the grid and ``imports = ["colorsys"]``: `import colorsys` finds
    Python's own colorsys first, and the load imported that, never the file, recording it
    as the plugin. Naming the file imports it."""
    plugin = tmp_path / "colorsys.py"
    plugin.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    grid = loud_grid(tmp_path)
    body = grid.read_text()
    grid.write_text('imports = ["colorsys"]\n' + body)
    found = os.path.realpath(importlib.util.find_spec("colorsys").origin)
    assert_refused(grid, [str(plugin), found, "'colorsys.py' in place of 'colorsys'"])
    assert not (tmp_path / "ran").exists()
    grid.write_text('imports = ["colorsys.py"]\n' + body)  # the fix
    assert load_grid(grid).imports == [str(plugin.resolve())]
    assert (tmp_path / "ran").exists()
