"""Labels that read alike across scripts (hostile pass 6, defect 8): "relational" and
"relаtional" with a Cyrillic а were two report rows a reader could not tell apart. Two labels
of one kind whose Unicode TR39 confusable skeletons are equal are refused at load, before any
work; a label in any script alone stays valid (ablations/grid/validate.py: check_entries). And
(hostile pass 7, D7) characters that render as nothing or blank outside the format and control
categories (a Hangul filler, a variation selector, the Braille blank) are no label's, and the
skeleton drops them (ablations/grid/schema.py: INVISIBLE)."""

import pytest
from grids import REL, STD, XS, assert_refused, tiny_grid
from test_grid_hostile5 import ENTRIES

from ablations.grid import spec
from ablations.grid.spec import load_grid
from ablations.grid.validate import skeleton

CYRILLIC = "rel\u0430tional"  # a Cyrillic а (U+0430) for the first Latin a
# The seventh pass's invisible characters that are neither format nor control characters:
# Hangul fillers (Lo), the combining grapheme joiner and variation selectors (Mn), the Braille
# blank (So); "std" and "std" with any of them read the same
BLANKS = ["\u3164", "\u115f", "\u034f", "\ufe0f", "\U000e0100", "\u180b", "\u2800"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Std", "std"),
        ("linear", "linear2"),
        ("\u03b1", "\u03b1\u03b1"),
        ("\u6ce8\u610f\u529b", "\u6ce8\u610f"),
    ],
)
def test_labels_that_read_differently_have_different_skeletons(a, b):
    assert skeleton(a) != skeleton(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [("relational", CYRILLIC), ("d32x1", "d32xl"), ("m", "rn"), ("std", "\uff53td")]
    + [("std", f"std{blank}") for blank in BLANKS]
    + [("std", f"s{blank}td") for blank in BLANKS],
)
def test_labels_that_read_alike_have_one_skeleton(a, b):
    assert skeleton(a) == skeleton(b)


@pytest.mark.parametrize("blank", BLANKS)
def test_a_label_with_a_character_that_renders_as_nothing_is_refused_escaped(tmp_path, blank):
    """The seventh pass: "standard" and "standard\\u3164" were two rows that read alike."""
    label = f"std{blank}"
    path = tiny_grid(tmp_path, mechanisms=ENTRIES["mechanisms"]("std", "std_"))
    path.write_text(path.read_text().replace('"std_"', f'"{label}"'), encoding="utf-8")  # raw
    assert_refused(path, [f"mechanisms[1].label = {ascii(label)} must be a non-empty str "
                          "without leading or trailing whitespace or invisible"])  # fmt: skip


@pytest.mark.parametrize("kind", ENTRIES)
def test_two_labels_of_one_kind_that_read_alike_are_refused_before_any_work(
    tmp_path, monkeypatch, kind
):
    def built(*args):
        raise AssertionError("a grid of confusable labels was built")

    monkeypatch.setattr(spec, "check_builds", built)
    path = tiny_grid(tmp_path, **{kind: ENTRIES[kind]("relational", CYRILLIC)})
    assert_refused(path, [
        f"{kind}[1].label = 'rel\\u0430tional' and {kind}[0].label = 'relational' read alike",
        "'\\u0430' CYRILLIC SMALL LETTER A, 'a' LATIN SMALL LETTER A",
        "rename one",
    ])  # fmt: skip


def test_a_confusable_label_set_by_an_override_is_refused(tmp_path):
    path = tiny_grid(tmp_path, mechanisms=[{**STD, "label": "relational"}, REL])
    assert_refused(path, ["mechanisms[1].label = 'rel\\u0430tional'", "read alike"],
                   [f"mechanisms[1].label={CYRILLIC}"])  # fmt: skip


def test_a_rule_naming_a_label_that_reads_as_a_valid_one_says_how_they_differ(tmp_path):
    path = tiny_grid(tmp_path, mechanisms=[{**STD, "label": "relational"}, REL])
    path.write_text(path.read_text() + f'\n[grid]\nexclude = [{{ mechanism = "{CYRILLIC}" }}]\n')
    assert_refused(path, [
        "grid.exclude[0].mechanism = ",
        "It reads as 'relational' but is 'rel\\u0430tional', which differs from it in 'a' LATIN "
        "SMALL LETTER A, '\\u0430' CYRILLIC SMALL LETTER A",
    ])  # fmt: skip


def test_a_rule_naming_a_label_with_a_blank_says_it_reads_as_the_valid_one(tmp_path):
    path = tiny_grid(tmp_path, mechanisms=[{**STD, "label": "relational"}, REL])
    blank = "relational\u3164"
    path.write_text(path.read_text() + f'\n[grid]\nexclude = [{{ mechanism = "{blank}" }}]\n')
    assert_refused(path, [
        "grid.exclude[0].mechanism = 'relational\\u3164' is not valid",
        "It reads as 'relational' but is 'relational\\u3164', which differs from it in "
        "'\\u3164' HANGUL FILLER",
    ])  # fmt: skip


def test_labels_in_any_script_alone_are_valid(tmp_path):
    mechanisms = [{**STD, "label": "\u03b1"}, {**REL, "label": "\u6ce8\u610f\u529b"}]
    path = tiny_grid(tmp_path, mechanisms=mechanisms, sizes=[{**XS, "label": "\u03bcP"}])
    cells = load_grid(path).cells
    assert {cell.mechanism for cell in cells} == {"\u03b1", "\u6ce8\u610f\u529b"}
