"""Your variant in the loop: a mechanism in a module of your own (examples/sliding_window.py)
runs in a CLI grid with 2 worker processes, through `--import`, from a Python script without a
`__main__` guard, and from an installed package's entry point; a plugin that cannot be imported
and a mechanism defined in the running script are one-line errors before any cell runs; a plugin
named two ways is imported once; each cell records its plugins' SHA-256, and a run with other
plugins than its finished cells' is refused before training. (On a Ray cluster:
tests/test_ray_cluster.py.)"""

import hashlib
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from grids import SAME_PAIR, STD, XS, tiny_grid

import attn_zoo as az
from ablations.grid.plugins import import_plugins
from ablations.grid.spec import SpecError, load_grid
from ablations.results.store import ResultsStore
from ablations.run.runner import run_grid

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sliding_window.py"
FAST = ["--set", "training.steps=4", "--set", "training.eval_every=2", "--set", "seeds=[0]"]


def run(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def done(store: Path) -> list[str]:
    return sorted(row["config"]["mechanism"] for row in ResultsStore(store, readonly=True).rows()
                  if row["status"] == "done")  # fmt: skip


@pytest.mark.slow  # the two-worker plugin path stays in the default suite: the script below
def test_the_example_grid_runs_with_two_worker_processes(tmp_path):
    store = tmp_path / "sw.sqlite"
    grid = ROOT / "examples" / "sliding_window.toml"
    cli = ["-m", "ablations.cli", "ablate", "run", str(grid), "--workers", "2"]
    result = run(*cli, *FAST, "--set", f"store={store}", cwd=tmp_path)  # from any folder
    assert result.returncode == 0, result.stdout + result.stderr
    assert done(store) == ["standard", "window8"]


@pytest.mark.slow  # `make test-slow`: the default suite stays under 10 minutes
def test_import_names_a_module_for_a_grid_that_does_not(tmp_path):
    grid = tiny_grid(tmp_path, mechanisms=[{"label": "w", "name": "sliding_window",
                                            "kwargs": {"n_heads": 2, "window": 2}}])  # fmt: skip
    cli = ["-m", "ablations.cli", "ablate", "run", str(grid), "--workers", "2", *FAST]
    refused = run(*cli)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "'sliding_window' is not valid" in refused.stderr
    result = run(*cli, "--import", str(EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert done(load_grid(grid, imports=[str(EXAMPLE)]).store) == ["w"]
    status = run("-m", "ablations.cli", "ablate", "status", str(grid), *FAST, "--import",
                 str(EXAMPLE))  # fmt: skip
    assert status.returncode == 0 and "1 done" in status.stdout, status.stderr


def test_a_script_without_a_main_guard_runs_once_with_two_workers(tmp_path):
    script = tmp_path / "my_grid.py"
    script.write_text(
        textwrap.dedent(f"""
        from pathlib import Path
        from ablations.run.runner import run_grid
        from ablations.grid.spec import load_grid

        with open({str(tmp_path / "runs.txt")!r}, "a") as runs:  # once per run of this script
            runs.write("ran\\n")
        spec = load_grid({str(ROOT / "examples" / "sliding_window.toml")!r},
                         ["store={tmp_path / "s.sqlite"}", "training.steps=4", "seeds=[0]"])
        print(run_grid(spec, workers=2))
    """)
    )
    result = run(str(script), cwd=tmp_path)  # from any folder: the grid's plugin still found
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "runs.txt").read_text() == "ran\n"  # workers never re-ran the script
    assert done(tmp_path / "s.sqlite") == ["standard", "window8"]


def test_a_mechanism_defined_in_the_running_script_is_refused_with_workers(tmp_path):
    script = tmp_path / "inline.py"
    mine = {"label": "mine", "name": "mine", "kwargs": {"n_heads": 2}}
    grid = tiny_grid(tmp_path, tasks=[SAME_PAIR], sizes=[XS], seeds=[0], mechanisms=[mine])
    script.write_text(
        textwrap.dedent(f"""
        import attn_zoo as az
        from ablations.run.runner import run_grid
        from ablations.grid.spec import SpecError, load_grid
        from attn_zoo.mechanisms.standard import StandardAttention

        @az.register_mechanism("mine")
        class Mine(StandardAttention):
            pass

        spec = load_grid({str(grid)!r}, ["training.steps=2"])
        try:
            run_grid(spec, workers=2)
        except SpecError as err:
            print("REFUSED", err)
        print(run_grid(spec, workers=1))  # one worker trains in this process: it works
    """)
    )
    result = run(str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "REFUSED" in result.stdout and "is defined in the script that runs the grid" in (
        result.stdout
    )
    assert "'done': 1" in result.stdout


def test_a_plugin_that_cannot_be_imported_is_one_line_before_any_cell(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('my bug')\n")
    grid = tiny_grid(tmp_path)
    grid.write_text('imports = ["broken.py"]\n' + grid.read_text())
    with pytest.raises(SpecError, match=r"plugin '.*broken.py' \(named by grid.toml imports\[0\]\) "
                       r"cannot be imported: RuntimeError: my bug"):  # fmt: skip
        load_grid(grid)
    with pytest.raises(SpecError, match="plugin 'no_such_module' .*ModuleNotFoundError"):
        load_grid(tiny_grid(tmp_path, file="other.toml"), imports=["no_such_module"])
    result = run("-m", "ablations.cli", "ablate", "run", str(grid))
    assert result.returncode == 1 and result.stderr.startswith("error:")
    assert len(result.stderr.strip().splitlines()) == 1 and "my bug" in result.stderr
    assert not (tmp_path / "tiny.sqlite").exists()  # before any cell


@pytest.mark.parametrize(
    ("imports", "message"),
    [
        ('[""]', "imports[0] = '' must be a non-empty str"),
        ("[1]", "imports[0] = 1 must be a non-empty str"),
        ('"my_attention"', "imports = 'my_attention' must be a list of modules or .py files"),
    ],
)
def test_a_grid_imports_that_is_not_a_list_of_names_is_one_line_naming_it(
    tmp_path, imports, message
):
    grid = tiny_grid(tmp_path)
    grid.write_text(f"imports = {imports}\n" + grid.read_text())
    with pytest.raises(SpecError, match=re.escape(message)):
        load_grid(grid)


@pytest.mark.slow  # `make test-slow`: the default suite stays under 10 minutes
def test_an_installed_package_registers_through_its_entry_point(tmp_path):
    """A distribution on the path whose entry point (group attn_zoo.plugins) names a module:
    the grid names its mechanism without imports, and worker processes find it too."""
    site = tmp_path / "site"
    (site / "my_attention_pkg-0.1.dist-info").mkdir(parents=True)
    shutil.copy(EXAMPLE, site / "my_window.py")
    info = site / "my_attention_pkg-0.1.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-attention-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attn_zoo.plugins]\nwindow = my_window\n")
    grid = tiny_grid(tmp_path, seeds=[0], mechanisms=[{"label": "w", "name": "sliding_window",
                                                       "kwargs": {"n_heads": 2}}])  # fmt: skip
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}
    result = run("-m", "ablations.cli", "ablate", "run", str(grid), "--workers", "2", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert done(tmp_path / "tiny.sqlite") == ["w"]
    listed = run("-c", "import attn_zoo as az; print(az.list_mechanisms())", env=env)
    assert "sliding_window" in listed.stdout, listed.stderr


def test_the_example_mechanism_agrees_across_backends_and_with_its_band(example_plugin):
    from attn_zoo.testing import assert_mechanism_backends_agree

    kwargs = {"d_model": 8, "n_heads": 2, "window": 3}
    for is_causal in (False, True):
        assert_mechanism_backends_agree("sliding_window", kwargs, length=19, is_causal=is_causal)
    torch.manual_seed(0)
    layer = az.build("sliding_window", d_model=8, n_heads=2, window=2).double()
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    base = layer(x, is_causal=True)
    x2 = x.clone()
    x2[:, 2] += 1.0  # position 2 is seen by queries 2 and 3 only (window 2, causal)
    changed = (layer(x2, is_causal=True) - base).abs().amax(-1)[0] > 1e-12
    assert changed.tolist() == [False, False, True, True, False, False, False]


def test_the_example_mechanism_adds_a_float_mask_to_the_scores_as_standard_attention_does(
    example_plugin,
):
    torch.manual_seed(0)
    window = az.build("sliding_window", d_model=8, n_heads=2, window=2, backend="naive").double()
    standard = az.build("standard", d_model=8, n_heads=2, backend="naive").double()
    standard.load_state_dict(window.state_dict())
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    bias = torch.zeros(6, 6, dtype=torch.float64)
    bias[:, 0] = -5.0  # a finite bias against key 0
    offset = torch.arange(6)[:, None] - torch.arange(6)  # i - j
    for is_causal, near in ((False, offset.abs() < 2), (True, (offset >= 0) & (offset < 2))):
        band = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~near, -torch.inf)
        biased = window(x, attn_mask=bias, is_causal=is_causal)
        assert (biased - window(x, is_causal=is_causal)).abs().max() > 1e-3  # the bias counts
        torch.testing.assert_close(biased, standard(x, attn_mask=bias + band))


PLUGIN = """
import attn_zoo as az
from attn_zoo.mechanisms.standard import StandardAttention

@az.register_mechanism({name!r})
class Mine(StandardAttention):
    pass
"""


def test_a_plugin_named_as_a_file_and_as_a_module_is_imported_once(tmp_path, monkeypatch):
    (tmp_path / "twice_mine.py").write_text(PLUGIN.format(name="twice_mine"))
    monkeypatch.syspath_prepend(str(tmp_path))  # `twice_mine` is a module on sys.path too
    grid = tiny_grid(tmp_path, seeds=[0], mechanisms=[{"label": "m", "name": "twice_mine",
                                                       "kwargs": {"n_heads": 2}}])  # fmt: skip
    grid.write_text('imports = ["twice_mine.py"]\n' + grid.read_text())
    spec = load_grid(grid, imports=["twice_mine"])  # was: 'twice_mine' is already registered
    assert [cell.mechanism_name for cell in spec.cells] == ["twice_mine"]
    (tmp_path / "twice_other.py").write_text(PLUGIN.format(name="twice_other"))
    import_plugins(["twice_other"])  # the module first, then its file
    import_plugins([str(tmp_path / "twice_other.py")])
    assert "twice_other" in az.list_mechanisms()


def stored_env(store: Path) -> list[dict]:
    return [row["environment"] for row in ResultsStore(store, readonly=True).rows()]


def test_each_cell_records_its_plugins_and_a_run_with_other_ones_is_refused(tmp_path):
    plugin = tmp_path / "record_mine.py"
    plugin.write_text(PLUGIN.format(name="record_mine"))
    grid = tiny_grid(tmp_path, seeds=[0], mechanisms=[STD])
    digest = hashlib.sha256(plugin.read_bytes()).hexdigest()
    run_grid(load_grid(grid, imports=[str(plugin)]), workers=1, out=io.StringIO())
    assert [env["plugins"] for env in stored_env(tmp_path / "tiny.sqlite")] == [
        {str(plugin): digest}
    ]
    for imports in ([], [str(plugin)]):  # none where the cell had one; the file edited
        spec = load_grid(grid, ["seeds=[0, 1]"], imports=imports)
        with pytest.raises(SpecError) as err:
            run_grid(spec, workers=1, out=io.StringIO())
        message = str(err.value)
        assert message.startswith(f"{grid}: cell ") and "\n" not in message
        assert f"trained with the plugins {{record_mine.py: {digest[:12]}}}" in message
        assert len(stored_env(tmp_path / "tiny.sqlite")) == 1  # refused before training
        plugin.write_text(plugin.read_text() + "# edited\n")
    with sqlite3.connect(tmp_path / "tiny.sqlite") as db:  # a store from before the record
        db.execute("UPDATE cells SET environment = ?", (json.dumps({"torch": "2"}),))
    db.close()
    spec = load_grid(grid, ["seeds=[0, 1]"])
    assert run_grid(spec, workers=1, out=io.StringIO())["done"] == 1  # nothing to compare
    assert sorted(map(str, (env.get("plugins") for env in stored_env(spec.store)))) == [
        "None", "{}"
    ]  # fmt: skip
    with pytest.raises(SpecError, match=r"trained with the plugins \{\}, this run imports "
                       r"\{record_mine.py: "):  # fmt: skip
        run_grid(load_grid(grid, ["seeds=[0, 1, 2]"], imports=[str(plugin)]), workers=1)
