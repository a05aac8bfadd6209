"""Grid specs: expansion, include/exclude, overrides, and errors naming file, key and value."""

import textwrap

import pytest

from ablations.grid.spec import SpecError, load_grid

GRID = textwrap.dedent(
    """
    name = "t"
    seeds = [0, 1]

    [[tasks]]
    name = "same_pair"
    kwargs = { n_train = 64 }

    [[tasks]]
    name = "match_pattern"

    [[sizes]]
    label = "small"
    d_model = 16
    n_layers = 1

    [[mechanisms]]
    label = "std"
    name = "standard"
    kwargs = { n_heads = 2 }

    [[mechanisms]]
    name = "relational"
    kwargs = { n_heads = 2 }

    [training]
    steps = 20

    [grid]
    exclude = [{ task = "match_pattern", mechanism = "std" }]
    include = [{ task = "match_pattern", size = "small", mechanism = "std", seed = 7 }]
    """
)


def write(tmp_path, text=GRID):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


def test_expansion_with_exclude_include_and_defaults(tmp_path):
    spec = load_grid(write(tmp_path))
    cells = spec.cells
    labels = [(c.task, c.mechanism, c.seed) for c in cells]
    assert len(cells) == 2 * 2 * 2 - 2 + 1
    assert ("match_pattern", "std", 0) not in labels and ("match_pattern", "std", 7) in labels
    assert ("match_pattern", "relational", 1) in labels  # label defaults to the name
    assert cells[0].training.steps == 20 and cells[0].training.batch_size == 64
    assert cells[0].task_kwargs == {"n_train": 64}
    assert spec.store == tmp_path / "results" / "t.sqlite"  # relative to the grid's folder
    assert len({str(c.config()) for c in cells}) == len(cells)


def test_overrides(tmp_path):
    spec = load_grid(
        write(tmp_path), ["training.steps=5", "seeds=[3]", "training.schedule=constant"]
    )
    assert spec.training.steps == 5 and spec.seeds == [3] and spec.training.schedule == "constant"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            ('name = "same_pair"', 'name = "same_pairs"'),
            r"tasks\[0\]\.name = 'same_pairs' is not valid\. Did you mean 'same_pair'",
        ),
        (
            ('name = "relational"', 'name = "relationl"'),
            r"mechanisms\[1\]\.name = 'relationl'.*Did you mean 'relational'",
        ),
        (
            ("kwargs = { n_train = 64 }", "kwargs = { n_trian = 64 }"),
            r"tasks\[0\]\.kwargs\.n_trian \(key\).*Did you mean 'n_train'",
        ),
        (("steps = 20", "step = 20"), r"training\.step \(key\).*Did you mean 'steps'"),
        (("steps = 20", 'steps = "many"'), r"training\.steps = 'many' must be int"),
        (("d_model = 16", "d_model = 16.5"), r"sizes\[0\]\.d_model = 16\.5 must be int"),
        (("seeds = [0, 1]", "seeds = []"), "seeds = \\[\\] must be a non-empty list"),
        (
            ('mechanism = "std" }]', 'mechanism = "sdt" }]'),
            r"grid\.exclude\[0\]\.mechanism = 'sdt'.*Did you mean 'std'",
        ),
        (
            ("kwargs = { n_heads = 2 }\n\n[[mech", "kwargs = { n_head = 2 }\n\n[[mech"),
            r"mechanisms\[0\]\.kwargs\.n_head \(key\)",
        ),
    ],
)
def test_errors_name_file_key_value_and_choices(tmp_path, change, match):
    old, new = change
    assert old in GRID
    path = write(tmp_path, GRID.replace(old, new, 1))
    with pytest.raises(SpecError, match=match) as err:
        load_grid(path)
    assert str(path) in str(err.value)


def test_bad_override_and_unreadable_file(tmp_path):
    with pytest.raises(SpecError, match="must look like key=value"):
        load_grid(write(tmp_path), ["training.steps"])
    with pytest.raises(SpecError, match="cannot read the grid spec"):
        load_grid(tmp_path / "missing.toml")
