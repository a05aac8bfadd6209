"""A grid's [search]: trials are cells of the store, a resumed search proposes what an
uninterrupted one does, bad [search] tables are one-line errors, reports read the trials."""

import io
from pathlib import Path

import pytest
from grids import STD, assert_refused, tiny_grid

from ablations.cli import main
from ablations.runner import run_grid
from ablations.search import best_text, run_search, trial_spec
from ablations.spec import SpecError, load_grid
from ablations.store import ResultsStore

LR = 'space."training.lr" = { low = 1e-4, high = 3e-2, log = true }'


def search_grid(tmp_path: Path, *search: str, sweep: str = "", name: str = "tiny") -> Path:
    """A one-mechanism tiny grid (seeds 0 and 1) with a [search] of `search` lines (default:
    4 trials of a log-uniform lr, 2 of them random) and [selection] over the lr."""
    path = tiny_grid(tmp_path, name=name, mechanisms=[STD], training={"steps": 10, "eval_every": 5})
    lines = ["[search]", *(search or ("trials = 4", "startup_trials = 2", LR))]
    lines += ["[selection]", 'over = ["training.lr"]']
    if sweep:
        lines += ["[sweep]", sweep]
    path.write_text(path.read_text() + "\n".join(lines) + "\n")
    return path


def trials(spec) -> dict[str, dict]:
    """The store's rows by key."""
    return {row["key"]: row for row in ResultsStore(spec.store, readonly=True).rows()}


def test_a_search_stores_distinct_trials_resumes_them_and_proposes_as_if_uninterrupted(
    tmp_path, capsys
):
    path = search_grid(tmp_path)
    spec = load_grid(path)
    assert spec.cells == [] and "training.lr" in spec.swept_keys
    first = run_search(load_grid(path, ["search.trials=2"]), workers=1, out=io.StringIO())
    assert first["done"] == 2  # interrupted after two trials
    kept = trials(spec)
    counts = run_search(spec, workers=1, out=io.StringIO())
    assert counts == {"done": 2, "failed": 0, "diverged": 0}  # only the missing two trained
    rows = trials(spec)
    assert len(rows) == 4 and all(rows[key] == row for key, row in kept.items())
    lrs = [row["config"]["training"]["lr"] for row in rows.values()]
    assert len(set(lrs)) == 4 and all(1e-4 <= lr <= 3e-2 for lr in lrs)
    assert {row["config"]["seed"] for row in rows.values()} == {0}
    assert run_search(spec, workers=1, out=io.StringIO())["done"] == 0

    straight = load_grid(path, [f"store={tmp_path / 'straight.sqlite'}"])
    run_search(straight, workers=1, out=io.StringIO())
    assert sorted(trials(straight)) == sorted(rows)  # the same four cells, the same keys

    assert sorted(c.key for c in trial_spec(spec).cells) == sorted(rows)
    best = max(rows.values(), key=lambda row: row["metrics"]["val_acc"])
    text = best_text(spec)
    assert f"--set 'mechanisms[0].training.lr={best['config']['training']['lr']}'" in text
    assert main(["report", str(path), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "4 of 4" in report  # the selection's eligible of tried: every trial
    assert main(["ablate", "status", str(path)]) == 0
    assert "4 done" in capsys.readouterr().out


def test_a_proposal_already_tried_is_the_same_cell_and_every_choice_is_tried_once(tmp_path):
    path = search_grid(
        tmp_path, "trials = 3", 'space."training.lr" = { choices = [1e-3, 3e-3, 1e-2] }'
    )
    spec = load_grid(path)
    assert run_search(spec, workers=1, out=io.StringIO())["done"] == 3
    assert sorted(r["config"]["training"]["lr"] for r in trials(spec).values()) == [
        1e-3, 3e-3, 1e-2
    ]  # fmt: skip


def test_a_search_without_optuna_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr("ablations.search.find_spec", lambda name: None)
    spec = load_grid(search_grid(tmp_path))
    with pytest.raises(
        SpecError, match=r"\[search\] needs optuna: pip install 'attn_zoo\[search\]'"
    ):
        run_search(spec, workers=1, out=io.StringIO())
    assert not spec.store.exists()  # before any cell


def test_run_grid_refuses_a_searched_grid(tmp_path):
    with pytest.raises(SpecError, match=r"\[search\] runs with ablations.search.run_search"):
        run_grid(load_grid(search_grid(tmp_path)), workers=1, out=io.StringIO())


@pytest.mark.parametrize(
    ("search", "fragments"),
    [
        (["trials = 0", LR], ["search.trials = 0 must be int >= 1"]),
        (["trials = 2", 'sampler = "grid"', LR], ["search.sampler = 'grid' is not valid"]),
        (["trials = 2", 'metric = "test_acc"', LR], ["search.metric = 'test_acc' is not valid"]),
        (["trials = 2", "space = {}"], ["search.space = {} must be a non-empty table"]),
        (["trials = 2", 'space."training.lrr" = { low = 1, high = 2 }'],
         ["search.space.training.lrr (key) = 'lrr' is not valid", "Did you mean 'lr'?"]),
        (["trials = 2", 'space."optim.lr" = { low = 1, high = 2 }'],
         ["search.space.optim.lr (key) = 'optim.lr' is not valid"]),
        (["trials = 2", 'space."training.lr" = { low = 0.1, high = 0.01 }'],
         ["search.space.training.lr.low = 0.1 must be below high = 0.01"]),
        (["trials = 2", 'space."training.lr" = { high = 0.01 }'],
         ["search.space.training.lr is missing 'low'"]),
        (["trials = 2", 'space."training.lr" = { low = 1e-3, high = 0.01, step = 2 }'],
         ["search.space.training.lr.step (key) = 'step' is not valid"]),
        (["trials = 2", 'space."training.lr" = { low = -1.0, high = 0.01 }'],
         ["search.space.training.lr.low = -1.0 must be a finite float > 0"]),
        (["trials = 2", 'space."model.dropout" = { low = 0.0, high = 0.5, log = true }'],
         ["search.space.model.dropout.low = 0.0 must be > 0 with log = true"]),
        (["trials = 2", 'space."training.steps" = { low = 5.5, high = 9, int = true }'],
         ["search.space.training.steps.low = 5.5 must be an int (int = true)"]),
        (["trials = 2", 'space."training.lr" = { choices = [] }'],
         ["search.space.training.lr.choices = [] must be a non-empty list"]),
        (["trials = 2", 'space."training.lr" = { choices = [1e-3, 1e-3] }'],
         ["search.space.training.lr.choices[1] = 0.001 repeats a value"]),
        (["trials = 4", 'space."training.lr" = { choices = [1e-3, 3e-3, 1e-2] }'],
         ["search.trials = 4 is more than the 3 settings of search.space"]),
    ],
)  # fmt: skip
def test_an_invalid_search_table_is_one_line_naming_the_key(tmp_path, search, fragments):
    assert_refused(search_grid(tmp_path, *search), fragments)


def test_a_key_both_searched_and_swept_is_refused(tmp_path):
    path = search_grid(tmp_path, "trials = 2", LR, sweep="training.lr = [1e-3, 3e-3]")
    assert_refused(path, ["search.space.training.lr is also swept", "searched or swept, not both"])
