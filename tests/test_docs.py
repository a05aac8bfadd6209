"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict`, its API
pages come from the docstrings, its includes are the repository's files, and a broken reference
fails the build. (Every Python block of the guides runs: tests/test_readme.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # no banner about MkDocs' successor


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` into `site`."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", site]
    return subprocess.run(
        [str(c) for c in command], cwd=config.parent, env=ENV, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def test_the_site_builds_strict_with_the_api_and_the_included_files(tmp_path):
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    site = tmp_path / "site"
    api = (site / "api" / "attn_zoo" / "index.html").read_text()
    for name in ("build", "register_mechanism", "register_backend", "Capabilities"):
        assert f'id="attn_zoo.{name}"' in api  # a section per public name, from its docstring
    ablations = (site / "api" / "ablations" / "index.html").read_text()
    for name in (
        "run.runner.run_grid",
        "grid.spec.load_grid",
        "results.store.ResultsStore",
        "report.build.write_report",
    ):
        assert f'id="ablations.{name}"' in ablations
    extending = (site / "extending" / "index.html").read_text()
    assert "SlidingWindowAttention" in extending  # examples/sliding_window.py, included
    reports = (site / "reports" / "index.html").read_text()
    assert 'src="../img/demo_report.png"' in reports
    for page in ("search", "tracking", "claims", "testing_kit"):  # the manual the README left
        assert (site / page / "index.html").is_file(), page
    assert (site / "img" / "demo_report.png").read_bytes() == (
        ROOT / "docs" / "img" / "demo_report.png"
    ).read_bytes()


PLANTED = {  # page: what is added to it, and what the failed build names
    "api/attn_zoo.md": ("\n::: attn_zoo.no_such_thing\n", "attn_zoo.no_such_thing"),
    "quickstart.md": ("\nSee [build][attn_zoo.no_such_thing].\n", "attn_zoo.no_such_thing"),
    "extending.md": ('\n```py\n--8<-- "examples/no_such_file.py"\n```\n', "no_such_file.py"),
    "index.md": ("\nSee [the guide](no_such_page.md).\n", "no_such_page.md"),
}


@pytest.mark.slow  # 3-9 s each; the real site's build above runs by default (about 8 s)
@pytest.mark.parametrize("page", sorted(PLANTED))
def test_a_broken_reference_fails_the_strict_build(tmp_path, page):
    """A copy of the site with one broken thing planted in one page: a name the code does not
    define (an API block, a cross-reference), an included file that does not exist, a link to
    a page that does not exist. The strict build fails and names it."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for folder in ("attn_zoo", "ablations", "examples"):  # the code and files the pages name
        (tmp_path / folder).symlink_to(ROOT / folder)
    text, named = PLANTED[page]
    path = tmp_path / "docs" / page
    path.write_text(path.read_text() + text)
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0, result.stderr[-3000:]
    assert named in result.stderr


def test_the_grid_file_reference_is_the_one_the_schema_gives():
    """docs/grid_reference.md is generated (make grid-reference): a key added to or changed in
    the schema without regenerating it fails here. Generated in a process of its own, as make
    does: this one's registries may hold the mechanisms other tests registered."""
    command = [sys.executable, "-m", "ablations.grid.reference"]
    generated = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    assert (ROOT / "docs" / "grid_reference.md").read_text() == generated.stdout
