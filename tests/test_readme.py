"""Every Python block of the README and of the guides (docs/) runs verbatim: each page's blocks in
order, in one namespace and a folder of their own, as a reader would paste them; the README's
links lead to files and headings that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """The ```python blocks of `page`: (line number of the fence, code)."""
    text = page.read_text()
    return [
        (text[: match.start()].count("\n") + 1, match.group(1))
        for match in re.finditer(r"```python\n(.*?)```", text, re.S)
    ]


SHOWN = [page for page in PAGES if python_blocks(page)]


def test_the_readme_and_the_guides_have_python_blocks():
    assert python_blocks(ROOT / "README.md")
    assert sum(len(python_blocks(page)) for page in SHOWN) >= 12  # a broken pattern finds none


@pytest.mark.parametrize("page", SHOWN, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_python_block_of_a_page_runs_verbatim(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files the blocks write (maps.png) land here
    for folder in ("ablations", "examples"):  # paths as from the repository
        (tmp_path / folder).symlink_to(ROOT / folder)
    where = page.relative_to(ROOT)
    namespace: dict = {"__name__": page.stem}
    for line, block in python_blocks(page):
        try:
            exec(compile(block, f"{where}:{line}", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"{where} block at line {line} failed: {err!r}") from err
    for written in re.findall(r'savefig\("([^"]+)"\)', page.read_text()):
        assert (tmp_path / written).stat().st_size > 0, written


def test_the_example_plugin_shown_is_the_file_the_tests_run():
    """docs/extending.md shows examples/sliding_window.py by including it (the built page holds
    the file's text: tests/test_docs.py), and its Python block imports that same file."""
    text = (ROOT / "docs" / "extending.md").read_text()
    assert '```py\n--8<-- "examples/sliding_window.py"\n```' in text
    assert 'import_plugins(["examples/sliding_window.py"])' in text


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and the site's table of contents write it: lower case,
    punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_of_the_readme_leads_to_a_file_and_heading_that_exist():
    """Relative links (docs/grids.md, docs/reports.md#the-demo, a report, an image), as GitHub
    resolves them from the repository's root."""
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert len(local) >= 15
    for link in local:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.*)$", (ROOT / path).read_text(), re.M)
            assert anchor in map(slug, headings), link
