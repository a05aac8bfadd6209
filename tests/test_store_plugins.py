"""A grid whose store was run with `--import PLUGIN` names the plugin when status or report is
asked without it: the unknown mechanism's error says which plugins the store's cells ran with
(ResultsStore.plugins), so the fix is one copy-paste away. Real processes: the CLI."""

import os
import subprocess
import sys
from pathlib import Path

from grids import tiny_grid

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "sliding_window.py"
WINDOW = {"label": "w", "name": "sliding_window", "kwargs": {"n_heads": 2, "window": 2}}


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "ablations.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_status_and_report_without_the_plugin_name_the_one_the_store_recorded(tmp_path):
    grid = str(
        tiny_grid(tmp_path, mechanisms=[WINDOW], seeds=[0], training={"steps": 4, "eval_every": 2})
    )
    ran = cli("ablate", "run", grid, "--import", str(PLUGIN), "--workers", "1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    hint = f"(its store's cells were run with plugins: try --import {PLUGIN})"
    for command in (["ablate", "status", grid], ["report", grid, "--out", str(tmp_path / "r")]):
        refused = cli(*command)
        assert refused.returncode != 0
        assert "mechanisms[0].name = 'sliding_window' is not valid" in refused.stderr
        assert hint in refused.stderr
    assert cli("ablate", "status", grid, "--import", str(PLUGIN)).returncode == 0  # it works
