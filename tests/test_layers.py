"""The layer contract: kernels <- mechanisms <- models <- applications, one way only, and the
library importable with torch and einops alone."""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from installed import link_dependencies

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
HAS_TRITON = importlib.util.find_spec("triton") is not None
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
    assert "5 kept, 0 broken" in result.stdout


@needs_linter
@pytest.mark.parametrize(
    "module, upward_import",
    [
        ("attn_zoo/kernels/heads.py", "from attn_zoo.mechanisms import base"),
        ("attn_zoo/mechanisms/base.py", "from attn_zoo.models import block"),
        ("attn_zoo/models/common.py", "import ablations.results.store"),
        ("attn_zoo/registry.py", "import attn_zoo.kernels.dispatch"),
        ("attn_zoo/kernels/dispatch.py", "import pandas"),
        ("ablations/grid/cell.py", "import ablations.run.runner"),  # a later stage
        ("ablations/results/store.py", "import ablations.grid.cell"),  # results under grid
        ("ablations/run/train.py", "import ablations.report.selection"),
        ("ablations/report/pages.py", "import ablations.bench.measure"),
        ("ablations/tasks/mqar.py", "import ablations.results.store"),  # two siblings
        ("ablations/labels.py", "import ablations.tasks"),  # a shared leaf imports no stage
        ("ablations/report/figures.py", "import ablations.tasks.grammar"),  # a report builds none
        ("ablations/run/status.py", "import ablations.run.runner"),  # a circle: runner imports it
        ("attn_zoo/kernels/softmax/naive.py", "import attn_zoo.kernels.softmax.chunked"),
    ],
)
def test_an_upward_import_breaks_the_contract(tmp_path, module, upward_import):
    """The same contracts on a copy of the tree with one import that goes the wrong way (up a
    layer, to a package the library may not need, or round a circle of sibling modules)."""
    for package in ("attn_zoo", "ablations"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{upward_import}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout


def only_the_library_needs(folder: Path) -> Path:
    """`folder` filled with links to the installed distributions that torch and einops need
    (their dependency closure, by their metadata) and to attn_zoo: a stand-in for a fresh venv
    where only `pip install attn_zoo` ran. Returns `folder`."""
    link_dependencies(folder, ["torch", "einops"])
    (folder / "attn_zoo").symlink_to(ROOT / "attn_zoo")
    return folder


def test_import_attn_zoo_needs_only_torch_and_einops(tmp_path):
    """In a process that sees only the packages torch and einops need (no pandas, matplotlib,
    hypothesis, ray, transformers, ..., no applications), the library imports (without
    torch._dynamo: `constant_when_compiled`), builds every sequence mechanism into a language
    model, trains a step and records maps. Triton is visible too where installed (torch's CUDA
    wheels need it) and none of this imports it: only a launch of the Triton kernels does
    (attn_zoo/kernels/relational/triton.py). Without the C++ kernel (ATTN_ZOO_NO_CPP=1): it
    would build for this folder's torch, a minute here; tests/test_packaging.py (slow) builds
    it in a fresh venv."""
    farm = link_dependencies(only_the_library_needs(tmp_path), ["triton"])
    script = (
        textwrap.dedent(
            """
        import importlib.util
        import sys

        sys.path.insert(0, FARM)
        import torch
        import attn_zoo as az
        from attn_zoo.models import LanguageModel
        from attn_zoo.maps import record_attention_maps

        if "torch._dynamo" in sys.modules:  # 1.9 s of every process's start
            raise SystemExit("importing attn_zoo imported torch._dynamo")

        kwargs = {
            "standard": dict(n_heads=2),
            "relational": dict(n_heads=2, n_relations=2, symbol_retrieval="positional_symbols",
                               symbol_retrieval_kwargs=dict(max_length=8)),
            "dual": dict(n_heads_sa=1, n_heads_ra=1, symbol_retrieval="positional_symbols",
                         symbol_retrieval_kwargs=dict(max_length=8)),
            "additive": dict(n_heads=2), "linear": dict(n_heads=2),
            "differential": dict(n_heads=2), "sigmoid": dict(n_heads=2),
            "softcapped": dict(n_heads=2), "gla": dict(n_heads=2),
        }
        for name, extra in kwargs.items():
            lm = LanguageModel(vocab_size=11, d_model=16, n_layers=1, attention=name,
                               attention_kwargs=extra, max_block_size=8)
            idx = torch.randint(0, 11, (2, 8))
            _, loss = lm(idx, idx)  # noqa
            loss.backward()
            if name in ("standard", "relational", "dual", "differential", "softcapped"):
                assert record_attention_maps(lm, idx)
        if "triton" in sys.modules:  # 0.3 s of CPU in every process
            raise SystemExit("importing attn_zoo or a CPU step imported triton")
        if HAS_TRITON and importlib.util.find_spec("triton") is None:
            raise SystemExit("triton is not visible: the check above proves nothing")
        for name in ("pandas", "matplotlib", "hypothesis", "ablations"):
            try:
                __import__(name)
            except ModuleNotFoundError:
                pass
            else:
                raise SystemExit(f"{name} was importable: the folder is not isolated")
        print("ok")
        """
        )
        .replace("FARM", repr(str(farm)))
        .replace("HAS_TRITON", repr(HAS_TRITON))
    )
    result = subprocess.run(  # -I -S: no site-packages, no environment, no current folder
        [sys.executable, "-I", "-S", "-c", script],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "ATTN_ZOO_NO_CPP": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
