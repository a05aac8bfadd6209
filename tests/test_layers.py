"""The layer contract: kernels <- mechanisms <- models <- applications, one way only, and the
library importable with torch and einops alone."""

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
needs_linter = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's contracts (pyproject.toml) on the packages under `root`."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


@needs_linter
def test_the_layer_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


@needs_linter
@pytest.mark.parametrize(
    "module, upward_import",
    [
        ("attn_zoo/kernels/heads.py", "from attn_zoo.mechanisms import base"),
        ("attn_zoo/mechanisms/base.py", "from attn_zoo.models import block"),
        ("attn_zoo/models/common.py", "import ablations.store"),
        ("attn_zoo/names.py", "import attn_zoo.kernels.dispatch"),
        ("attn_zoo/kernels/dispatch.py", "import pandas"),
    ],
)
def test_an_upward_import_breaks_the_contract(tmp_path, module, upward_import):
    """The same contracts on a copy of the tree with one import that goes the wrong way."""
    for package in ("attn_zoo", "ablations"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{upward_import}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout


def extras_modules() -> set[str]:
    """Top-level module names of every package our extras add (the applications' and tests')."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for requirement in sum(extras["optional-dependencies"].values(), []):
        name = re.split(r"[^A-Za-z0-9_.-]", requirement)[0].lower().replace("-", "_")
        names.add({"import_linter": "importlinter"}.get(name, name))
    return names - {"attn_zoo"} | {"ablations"}


def test_import_attn_zoo_needs_only_torch_and_einops():
    """In a process where every package of the extras (pandas, matplotlib, hypothesis, ray,
    ...) and the applications are missing, the library imports, builds every sequence
    mechanism into a language model, trains a step and records attention maps."""
    blocked = sorted(extras_modules())
    assert {"pandas", "matplotlib", "hypothesis", "ray"} <= set(blocked)
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        BLOCKED = __BLOCKED__

        class WithoutExtras(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

        sys.meta_path.insert(0, WithoutExtras())
        import torch
        import attn_zoo as az
        from attn_zoo.models import LanguageModel
        from attn_zoo.maps import record_attention_maps

        kwargs = {
            "standard": dict(n_heads=2),
            "relational": dict(n_heads=2, n_relations=2, symbol_retrieval="positional_symbols",
                               symbol_retrieval_kwargs=dict(max_length=8)),
            "dual": dict(n_heads_sa=1, n_heads_ra=1, symbol_retrieval="positional_symbols",
                         symbol_retrieval_kwargs=dict(max_length=8)),
            "additive": dict(n_heads=2), "linear": dict(n_heads=2),
        }
        for name, extra in kwargs.items():
            lm = LanguageModel(vocab_size=11, d_model=16, n_layers=1, attention=name,
                               attention_kwargs=extra, max_block_size=8)
            idx = torch.randint(0, 11, (2, 8))
            _, loss = lm(idx, idx)  # noqa
            loss.backward()
            if name in ("standard", "relational", "dual"):
                assert record_attention_maps(lm, idx)
        for name in ("pandas", "ablations"):
            try:
                __import__(name)
            except ModuleNotFoundError:
                pass
            else:
                raise SystemExit(f"{name} was importable: the blocker does not work")
        print("ok", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
        """
    ).replace("__BLOCKED__", repr(blocked))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok []"
