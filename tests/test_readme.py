"""Every Python block of the README runs verbatim, in order, as a reader would paste them."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[tuple[int, str]]:
    text = (ROOT / "README.md").read_text()
    return [
        (text[: match.start()].count("\n") + 1, match.group(1))
        for match in re.finditer(r"```python\n(.*?)```", text, re.S)
    ]


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 6


def test_every_python_block_runs_verbatim(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files the blocks write (maps.png) land here
    for folder in ("ablations", "examples"):  # paths as from the repository
        (tmp_path / folder).symlink_to(ROOT / folder)
    namespace: dict = {"__name__": "readme"}
    for line, block in python_blocks():
        try:
            exec(compile(block, f"README.md:{line}", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"README.md block at line {line} failed: {err!r}") from err
    assert (tmp_path / "maps.png").stat().st_size > 0


def test_the_example_plugin_in_the_readme_is_the_file_the_tests_run():
    text = (ROOT / "README.md").read_text()
    (shown,) = re.findall(r"```py\n(.*?)```", text, re.S)
    assert shown == (ROOT / "examples" / "sliding_window.py").read_text()
