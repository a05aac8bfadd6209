"""The package as a user gets it: `python -m build` makes an sdist and a wheel (the wheel built
from the sdist), both hold the package data, and each, installed into a fresh venv, is what
runs there: imported from the venv (never from this checkout), every mechanism builds and runs
forward, the C++ relational kernel compiles from the installed .cpp and runs, and the
`attn-zoo` command reports the package's version. Slow (two builds of the C++ kernel, about
20 s each on 2 cores); `make package-smoke`.

The fresh venv is made without pip (`python -m venv --without-pip`, from this environment's
interpreter, so that it sees none of this environment's packages) and the artifact is installed
into it by this environment's pip (`pip --python VENV/bin/python install --no-deps
--no-index`), so nothing is downloaded. Its third-party dependencies, torch above all, come
from this environment through one .pth file naming a folder of links to exactly the
distributions the wheel's metadata requires (attn_zoo and attn_zoo[ablations]) and their own
requirements (tests/installed.py): attn_zoo itself is not among them, so the only attn_zoo
the venv can import is the one pip installed there, which the smoke script checks.
"""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from installed import link_dependencies
from packaging.requirements import Requirement
from test_empty_inputs import KWARGS

pytestmark = pytest.mark.slow
pytest.importorskip("build")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DATA = [  # globs, relative to the repository: files the installed package reads
    "attn_zoo/py.typed",
    "ablations/py.typed",
    "attn_zoo/kernels/relational/*.cpp",
    "ablations/report/templates/*.j2",
    "ablations/data/relations_game/*",
]
# Runs in the venv, from an empty folder: argv[1] is the venv. Prints attn_zoo's version.
SMOKE = """
import os, sys
from pathlib import Path

import torch
import attn_zoo as az
import ablations
from attn_zoo.kernels.relational import cpp

venv = Path(sys.argv[1]).resolve()
for module in (az, ablations, cpp):
    assert venv in Path(module.__file__).resolve().parents, module.__file__
assert cpp.SOURCE.is_file()

KWARGS = KWARGS_OF_TEST_EMPTY_INPUTS
assert set(KWARGS) == set(az.list_mechanisms()), az.list_mechanisms()
for name, kwargs in KWARGS.items():
    x = torch.randn((2, 3, 5, 8) if name.startswith("msa") else (2, 5, 8))
    layer = az.build(name, d_model=8, **kwargs)
    y = layer(x, is_causal=True) if layer.causal_only else layer(x)  # gla: causal only
    assert y.shape == x.shape and torch.isfinite(y).all(), name

torch.manual_seed(0)
ra = az.build("relational", d_model=16, n_heads=2, n_relations=2, backend="cpp",
              symbol_retrieval="positional_symbols", symbol_retrieval_kwargs=dict(max_length=8))
x = torch.randn(2, 8, 16, requires_grad=True)
y = ra(x, is_causal=True)
y.sum().backward()
assert x.grad is not None and torch.isfinite(x.grad).all()
ra.backend = "naive"
torch.testing.assert_close(y, ra(x, is_causal=True), atol=1e-5, rtol=1e-4)
builds = list(Path(os.environ["TORCH_EXTENSIONS_DIR"]).glob("*/build.ninja"))
assert len(builds) == 1 and str(cpp.SOURCE) in builds[0].read_text(), builds

from ablations.tasks import build_task  # the shipped relations-game boards
boards = build_task("relations_game_files", n_train=20, n_validation=10, n_test=10)
assert len(boards.splits(0)["train"]) == 20

from ablations.report.build import write_report  # the templates
from ablations.results.store import ResultsStore
store = ResultsStore(Path("store.sqlite"))
cell = dict(grid="smoke", task="same_pair", task_name="same_pair", task_kwargs={},
            size=dict(label="xs", d_model=8, n_layers=1), mechanism="standard",
            mechanism_name="standard", mechanism_kwargs=dict(n_heads=2),
            training=dict(steps=10), seed=0)
store.finish(store.claim(cell), "done", dict(test_acc=0.5, steps=10), [[10, 0.7, 0.7, 0.5]], {})
assert "smoke" in (write_report(store, Path("report")) / "index.html").read_text()
print(az.__version__)
""".replace("KWARGS_OF_TEST_EMPTY_INPUTS", repr(KWARGS))


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    """`command`, its output captured; AssertionError with its output if it fails."""
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel of this checkout, by `python -m build` (no build isolation:
    the build backend installed here, nothing downloaded)."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT], timeout=600)
    (sdist,) = out.glob("attn_zoo-*.tar.gz")
    (wheel,) = out.glob("attn_zoo-*.whl")
    return {"sdist": sdist, "wheel": wheel}


def package_data() -> set[str]:
    """The repository's files that PACKAGE_DATA names (each glob names at least one)."""
    found = {glob: {str(p.relative_to(ROOT)) for p in ROOT.glob(glob)} for glob in PACKAGE_DATA}
    assert all(found.values()), found
    return set().union(*found.values())


def test_the_wheel_and_the_sdist_hold_the_package_data(dist):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        in_wheel = set(wheel.namelist())
    with tarfile.open(dist["sdist"]) as sdist:
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for name in package_data():
        assert name in in_wheel, f"{name} is missing from {dist['wheel'].name}"
        assert name in in_sdist, f"{name} is missing from {dist['sdist'].name}"


def requirements(wheel: Path, extras: set[str]) -> list[str]:
    """The distributions the wheel requires, with `extras`, by its own metadata."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(name))
    names = []
    for text in metadata.get_all("Requires-Dist"):
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in {"", *extras}):
            names.append(requirement.name)
    return names


def fresh_venv(folder: Path, dependencies: list[str]) -> Path:
    """A venv in `folder` without pip and without this environment's packages, but for
    `dependencies` and their requirements, linked in by a .pth file. Its python."""
    run([sys.executable, "-m", "venv", "--without-pip", folder])
    python = folder / "bin" / "python"
    (site,) = folder.glob("lib/python*/site-packages")
    (folder / "dependencies").mkdir()
    links = link_dependencies(folder / "dependencies", dependencies)
    (site / "dependencies.pth").write_text(f"{links}\n")
    return python


@pytest.mark.parametrize("artifact", ["wheel", "sdist"])
def test_the_installed_package_runs_from_the_venv(dist, tmp_path, artifact):
    needs = requirements(dist["wheel"], {"ablations"})
    assert "attn_zoo" not in needs and {"torch", "einops", "ninja", "pandas"} <= set(needs)
    build = ["setuptools"] if artifact == "sdist" else []  # the sdist is built on install
    venv = tmp_path / "venv"
    python = fresh_venv(venv, needs + build)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
    }  # no PYTHONPATH: not this checkout
    install = ["--no-deps", "--no-index", "--no-build-isolation", dist[artifact]]
    pip = [sys.executable, "-m", "pip", "--python", python, "install", *install]
    run(pip, cwd=work, env=env, timeout=600)
    smoke = run([python, "-I", "-c", SMOKE, venv], cwd=work, env=env, timeout=600)
    version = smoke.stdout.strip().splitlines()[-1]
    assert version == dist["wheel"].name.split("-")[1]
    shown = run([venv / "bin" / "attn-zoo", "--version"], cwd=work, env=env)
    assert shown.stdout.strip() == f"attn-zoo {version}"
