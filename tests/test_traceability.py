"""Every number in the conclusions' prose and in the claims tables (the README's and
docs/claims.md's) comes from committed data (the rules: tests/traceability.py)."""

import re
import shutil
from pathlib import Path

import pytest
from traceability import (
    ALLOWED,
    ROOT,
    check_claims_table,
    check_conclusion,
    claims_rows,
    report,
)

CONCLUSIONS = sorted((ROOT / "ablations" / "grids").glob("*.conclusion.md"))


@pytest.mark.parametrize("path", CONCLUSIONS, ids=lambda p: p.name)
def test_every_number_in_a_conclusion_is_in_committed_data(path):
    found = check_conclusion(path)
    assert not found, report(found)


@pytest.mark.parametrize("page", ["README.md", "docs/claims.md"])
def test_every_number_in_a_claims_table_is_in_committed_data(page):
    found = check_claims_table(ROOT / page)
    assert not found, report(found)


def test_the_readme_and_the_manual_list_the_same_claims():
    """The README's table is one line per claim, docs/claims.md's holds the outcomes: the same
    claims, in the same order, and each README row links to the conclusion of a grid that
    docs/claims.md's row names."""
    readme = claims_rows((ROOT / "README.md").read_text())
    manual = claims_rows((ROOT / "docs" / "claims.md").read_text())
    assert len(readme) == len(manual) >= 5
    for (_, short), (_, full) in zip(readme, manual, strict=True):
        assert short.split(" | ")[0][:60] == full.split(" | ")[0][:60]  # the claim's opening
        conclusions = re.findall(r"ablations/grids/([\w-]+)\.conclusion\.md", short)
        assert conclusions, short
        for grid in conclusions:
            assert (ROOT / "ablations" / "grids" / f"{grid}.conclusion.md").is_file(), grid
            assert f"{grid}.toml" in full or f"reports/{grid}/" in full, (grid, full[:80])


def test_the_allowlist_gives_a_reason_for_every_phrase_and_each_holds_a_number():
    for phrase, reason in ALLOWED.items():
        assert reason.strip(), phrase
        assert any(c.isdigit() for c in phrase), phrase


@pytest.fixture
def grid(tmp_path) -> Path:
    """A repository root with one grid, g: its TOML, a paired.csv and an empty conclusion."""
    (tmp_path / "reports" / "g").mkdir(parents=True)
    (tmp_path / "reports" / "g" / "paired.csv").write_text(
        "task,a,b,mean,low,high,n\n"
        "occurs,dual,standard,0.02897,-0.04527,0.10307,5\n"
        "same,dual,standard,-0.0251,-0.0497,-0.000527,5\n"
    )
    (tmp_path / "ablations" / "grids").mkdir(parents=True)
    (tmp_path / "ablations" / "grids" / "g.toml").write_text(
        'name = "g"\nseeds = [0, 1, 2]\n# 7777 steps in a comment is no setting\n'
        "[training]\nsteps = 1500\nlr = 3e-2\n"
    )
    return tmp_path


def flagged(root: Path, text: str) -> list[str]:
    """The groups the check flags in a conclusion of grid g holding `text`."""
    path = root / "ablations" / "grids" / "g.conclusion.md"
    path.write_text(text)
    return [finding.text for finding in check_conclusion(path, root)]


@pytest.mark.parametrize(
    "text",
    [
        "dual − standard +0.029 [−0.045, +0.103]",  # U+2212 minus signs
        "dual - standard +0.029 [-0.045, +0.103]",  # ASCII ones
        "about +0.03",  # coarser than the data: rounds to it
        "standard ahead: −0.025 [−0.050, −0.0005]",
        "[−0.045, +0.103]",  # an interval without its mean
        "behind by 0.025",  # unsigned: either sign
        "1,500 steps, 3e-2, and 1500 again",  # the TOML's settings, thousands separator
        "95% intervals",  # allowed: a convention, not data
        "d64x2 on an H200, `make demo-2`, [report](reports/g/x9.md)",  # names, code, links
    ],
)
def test_traceable_numbers_pass(grid, text):
    assert flagged(grid, text) == []


@pytest.mark.parametrize(
    "text, untraceable",
    [
        ("+0.028", "+0.028"),  # not the data at that precision
        ("−0.029", "−0.029"),  # the wrong sign
        ("+0.029 [+0.045, +0.103]", "+0.029 [+0.045, +0.103]"),  # the wrong sign inside
        ("+0.029 [−0.050, +0.103]", "+0.029 [−0.050, +0.103]"),  # each in a row, not one
        ("1,501 steps", "1,501"),
        ("7,777 steps", "7,777"),  # in the TOML's comment only
        ("96% intervals", "96%"),
        ("3.6% above the floor", "3.6%"),
    ],
)
def test_untraceable_numbers_are_flagged(grid, text, untraceable):
    assert flagged(grid, text) == [untraceable]


def test_a_number_from_another_grid_is_traceable_only_where_the_text_cites_that_grid(grid):
    (grid / "reports" / "other").mkdir()
    (grid / "reports" / "other" / "summary.csv").write_text("task,test_acc_mean\nx,0.8123\n")
    assert flagged(grid, "the other grid reached 0.812") == ["0.812"]
    assert flagged(grid, "the other grid (reports/other/) reached 0.812") == []
    assert flagged(grid, "the other grid (`other.conclusion.md`) reached 0.812") == []


def test_a_data_csv_is_a_source_where_the_text_names_it(grid):
    data = grid / "ablations" / "data" / "paper"
    data.mkdir(parents=True)
    (data / "curves.csv").write_text("# a comment: 0.555\ntask,acc\nsame,0.902\n")
    assert flagged(grid, "the paper's 0.902") == ["0.902"]
    assert flagged(grid, "the paper's 0.902 (curves.csv)") == []
    assert flagged(grid, "the paper's 0.555 (curves.csv)") == ["0.555"]  # comments are no data


def test_a_planted_number_in_a_copy_of_a_conclusion_is_flagged_with_its_line(tmp_path):
    for grid in ("fastformer_char", "fastformer_char_long"):  # the conclusion cites the second
        shutil.copytree(ROOT / "reports" / grid, tmp_path / "reports" / grid,
                        ignore=shutil.ignore_patterns("*.png", "*.html", "*.md"))  # fmt: skip
        (tmp_path / "ablations" / "grids").mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "ablations" / "grids" / f"{grid}.toml", tmp_path / "ablations" / "grids")
    copy = tmp_path / "ablations" / "grids" / "fastformer_char.conclusion.md"
    shutil.copy(ROOT / "ablations" / "grids" / copy.name, copy)
    assert check_conclusion(copy, tmp_path) == []
    lines = copy.read_text().splitlines()
    planted = "Planted: 0.777 [0.700, 0.800]; as the report says, −0.006 [−0.019, +0.006]."
    copy.write_text("\n".join([*lines, "", planted]))
    found = check_conclusion(copy, tmp_path)
    assert [(f.line, f.text) for f in found] == [(len(lines) + 2, "0.777 [0.700, 0.800]")]
    message = report(found)
    assert f"ablations/grids/fastformer_char.conclusion.md:{len(lines) + 2}: 0.777" in message


README = """# x

| mechanism | notes |
|---|---|
| a | 12345 of them |

| claim | grid, command | outcome |
|---|---|---|
| A claim (Wu et al. 2021) | `ablations/grids/g.toml` | +0.029 [−0.045, +0.103] ([r](reports/g/)) |
| Another | `g.toml` | 1,500 steps, then 0.4242 |

After the table: 999.
"""


def test_the_claims_table_is_checked_row_by_row_against_what_each_row_cites(grid):
    readme = grid / "README.md"
    readme.write_text(README)
    assert [number for number, _ in claims_rows(README)] == [9, 10]
    found = check_claims_table(readme, grid)
    assert [(f.line, f.text) for f in found] == [(10, "0.4242")]
    readme.write_text(README.replace("`ablations/grids/g.toml` | +0.029", "none | +0.029"))
    assert [f.text for f in check_claims_table(readme, grid)] == ["0.4242"]  # the link is a cite
    readme.write_text(README.replace("([r](reports/g/))", ""))
    assert [f.text for f in check_claims_table(readme, grid)] == ["0.4242"]  # so is the TOML


def test_a_readme_without_one_claims_table_with_rows_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nno table\n")
    with pytest.raises(ValueError, match="0 tables headed"):
        check_claims_table(readme, tmp_path)
    readme.write_text("| claim | outcome |\n|---|---|\n\n")
    with pytest.raises(ValueError, match="has no rows"):
        check_claims_table(readme, tmp_path)
