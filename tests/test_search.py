"""A grid's [search]: trials are cells of the store, a resumed search proposes what an
uninterrupted one does, a pruner stops hopeless trials (stored pruned, never selected), a
trial that fails to build is a failed trial, one smoke test per model and one executor per
search, bad [search] tables are one-line errors, reports read the trials."""

import csv
import io
from pathlib import Path

import pytest
from grids import STD, assert_refused, tiny_grid, with_heads

from ablations.cli import main
from ablations.grid.spec import SpecError, load_grid
from ablations.results.store import ResultsStore
from ablations.run import runner
from ablations.run.local_executor import LocalExecutor
from ablations.run.runner import run_grid
from ablations.run.search import best_text, run_search, study_of, trial_spec, trials_of

LR = 'space."training.lr" = { low = 1e-4, high = 3e-2, log = true }'


def search_grid(
    tmp_path: Path,
    *search: str,
    sweep: str = "",
    name: str = "tiny",
    mechanisms: tuple = (STD,),
    steps: int = 10,
    over: str = "training.lr",
) -> Path:
    """A tiny grid (seeds 0 and 1; one mechanism by default) with a [search] of `search` lines
    (default: 4 trials of a log-uniform lr, 2 of them random) and [selection] `over` a key."""
    training = {"steps": steps, "eval_every": 5}
    path = tiny_grid(tmp_path, name=name, mechanisms=mechanisms, training=training)
    lines = ["[search]", *(search or ("trials = 4", "startup_trials = 2", LR))]
    lines += ["[selection]", f'over = ["{over}"]']
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


def test_a_search_meeting_the_store_file_another_run_is_creating_runs(tmp_path):
    """SQLite creates an empty file before the schema: a search that reads the store at that
    instant (it was refused as 'not an attn_zoo results store: an empty file') creates the
    schema itself first."""
    path = search_grid(tmp_path, "trials = 2", 'space."training.lr" = { choices = [1e-3, 3e-3] }')
    spec = load_grid(path)
    spec.store.parent.mkdir(parents=True, exist_ok=True)
    spec.store.touch()  # the other run's sqlite3.connect, before its first write
    assert run_search(spec, workers=1, out=io.StringIO())["done"] == 2


def test_a_search_without_optuna_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr("ablations.run.search.find_spec", lambda name: None)
    spec = load_grid(search_grid(tmp_path))
    with pytest.raises(
        SpecError, match=r"\[search\] needs optuna: pip install 'attn_zoo\[search\]'"
    ):
        run_search(spec, workers=1, out=io.StringIO())
    assert not spec.store.exists()  # before any cell


def test_run_grid_refuses_a_searched_grid(tmp_path):
    with pytest.raises(SpecError, match=r"\[search\] runs with ablations.run.search.run_search"):
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
        (["trials = 2", LR, 'pruner = "hyperband"'],
         ["search.pruner = 'hyperband' is not valid", "none", "median", "successive_halving"]),
        (["trials = 2", LR, 'pruner = "median"', "min_resource = 10"],
         ["search.min_resource = 10 sets pruner = 'successive_halving', but search.pruner = "
          "'median'"]),
        (["trials = 2", LR, "warmup_steps = 10"],
         ["search.warmup_steps = 10 sets pruner = 'median', but search.pruner = 'none'"]),
        (["trials = 2", LR, 'pruner = "median"', "warmup_steps = -1"],
         ["search.warmup_steps = -1 must be int >= 0"]),
        (["trials = 2", LR, 'pruner = "successive_halving"', "reduction_factor = 1"],
         ["search.reduction_factor = 1 must be int >= 2"]),
    ],
)  # fmt: skip
def test_an_invalid_search_table_is_one_line_naming_the_key(tmp_path, search, fragments):
    assert_refused(search_grid(tmp_path, *search), fragments)


def test_a_key_both_searched_and_swept_is_refused(tmp_path):
    path = search_grid(tmp_path, "trials = 2", LR, sweep="training.lr = [1e-3, 3e-3]")
    assert_refused(path, ["search.space.training.lr is also swept", "searched or swept, not both"])


@pytest.mark.parametrize("override", ["training.lr=0.5", "mechanisms[0].training.lr=0.5"])
def test_a_set_of_a_searched_key_is_refused(tmp_path, override):
    """The hostile pass: the search sampled training.lr as if the --set were not there."""
    with pytest.raises(SpecError, match=r"is overridden where \[search\] samples training\.lr"):
        load_grid(search_grid(tmp_path), [override])


def lr_search(tmp_path: Path, choices: str, trials: int, *pruner: str) -> Path:
    """The one-mechanism search grid (40 steps, evaluated every 5) over the lr `choices`, on
    val_loss (continuous: a stalled trial is behind at once), with the `pruner` lines."""
    space = f'space."training.lr" = {{ choices = {choices} }}'
    lines = [f"trials = {trials}", space, 'metric = "val_loss"', *pruner]
    return search_grid(tmp_path, *lines, steps=40)


MEDIAN = ['pruner = "median"', "prune_after_trials = 1"]


def test_a_pruner_stops_hopeless_trials_which_stay_pruned_and_are_never_selected(tmp_path, capsys):
    first = load_grid(lr_search(tmp_path, "[1e-2]", 1, *MEDIAN))
    assert run_search(first, workers=1, out=io.StringIO()) == {
        "done": 1, "failed": 0, "diverged": 0, "pruned": 0
    }  # fmt: skip
    path = lr_search(tmp_path, "[1e-2, 1e-8, 1e-7]", 3, *MEDIAN)  # same store, wider space
    spec = load_grid(path)
    out = io.StringIO()
    counts = run_search(spec, workers=1, out=out)
    assert counts == {"done": 0, "failed": 0, "diverged": 0, "pruned": 2}, out.getvalue()
    rows = {row["config"]["training"]["lr"]: row for row in trials(spec).values()}
    assert rows[1e-2]["status"] == "done" and rows[1e-2]["metrics"]["steps"] == 40
    for lr in (1e-8, 1e-7):  # the lr too small to learn: stopped at an evaluation, curve kept
        row = rows[lr]
        at = row["metrics"]["pruned_at"]
        assert row["status"] == "pruned" and 5 <= at < 40 and row["metrics"]["steps"] == at
        assert [point[0] for point in row["curve"]] == list(range(5, at + 1, 5))
        assert "test_acc" not in row["metrics"]
        assert f"pruned   same_pair/xs/std/lr={lr}/seed0: at step {at}" in out.getvalue()
    group = spec.search.groups[0]
    study = study_of(spec, group, trials_of(spec, group, list(trials(spec).values())))
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE", "PRUNED", "PRUNED"]
    assert all(t.intermediate_values for t in study.trials)  # rebuilt from the stored curves

    # a pruned trial is final: a resumed search (failed ones retried too) trains nothing
    again = run_search(spec, workers=1, retry_failed=True, out=io.StringIO())
    assert again == {"done": 0, "failed": 0, "diverged": 0, "pruned": 0}
    assert {row["config"]["training"]["lr"]: row for row in trials(spec).values()} == rows
    assert "--set 'mechanisms[0].training.lr=0.01'" in best_text(spec)  # never a pruned one
    assert "3 trials, 1 done, 2 pruned" in best_text(spec)

    assert main(["ablate", "status", str(path)]) == 0
    assert "2 pruned" in capsys.readouterr().out
    assert main(["report", str(path), "--out", str(tmp_path / "report")]) == 0
    with open(tmp_path / "report" / "selection.csv") as file:
        (chosen,) = list(csv.DictReader(file))
    assert chosen["best"] == "training.lr=0.01" and chosen["candidates"] == "1"
    for lr in (1e-8, 1e-7):
        reason = f"training.lr={lr}: 1 of 1 seeds pruned at step {rows[lr]['metrics']['pruned_at']}"
        assert reason in chosen["excluded"]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "1 done, 0 failed, 0 diverged, 0 running, 2 pruned" in report
    assert report.count("by the search's pruner") == 2  # listed among the cells not in tables


def test_a_resumed_search_with_a_pruner_prunes_what_an_uninterrupted_one_does(tmp_path):
    halving = ['pruner = "successive_halving"', "min_resource = 5", "reduction_factor = 2"]
    lines = ["startup_trials = 2", 'space."training.lr" = { low = 1e-8, high = 3e-2, log = true }']
    path = search_grid(tmp_path, "trials = 5", *lines, *halving, steps=30)
    run_search(load_grid(path, ["search.trials=2"]), workers=1, out=io.StringIO())
    resumed = load_grid(path)
    run_search(resumed, workers=1, out=io.StringIO())
    straight = load_grid(path, [f"store={tmp_path / 'straight.sqlite'}"])
    run_search(straight, workers=1, out=io.StringIO())

    def outcomes(spec):
        return {k: (r["status"], r["metrics"]["steps"]) for k, r in trials(spec).items()}

    assert outcomes(resumed) == outcomes(straight) and len(outcomes(straight)) == 5
    assert "pruned" in {status for status, _ in outcomes(straight).values()}


def test_a_searched_value_that_fails_to_build_is_a_failed_trial_and_the_search_goes_on(tmp_path):
    heads = 'space."mechanism_kwargs.n_heads" = { choices = [2, 3, 4, 5] }'  # d_model 16
    path = search_grid(tmp_path, "trials = 4", heads, over="mechanism_kwargs.n_heads")
    spec = load_grid(path)
    out = io.StringIO()
    assert run_search(spec, workers=1, out=out) == {"done": 2, "failed": 2, "diverged": 0}
    rows = {row["config"]["mechanism_kwargs"]["n_heads"]: row for row in trials(spec).values()}
    # two failures of four trials: at least one had a trial after it
    statuses = {n: row["status"] for n, row in rows.items()}
    assert statuses == {2: "done", 3: "failed", 4: "done", 5: "failed"}
    for n in (3, 5):
        assert f"failed   same_pair/xs/std/n_heads={n}/seed0: " in out.getvalue()
        assert "n_heads" in rows[n]["error"].strip().splitlines()[-1]
    group = spec.search.groups[0]
    study = study_of(spec, group, trials_of(spec, group, list(rows.values())))
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "COMPLETE", "FAIL", "FAIL"]


def test_a_search_smoke_tests_each_model_once_on_one_executor(tmp_path, monkeypatch):
    smoke_tests, executors = [], []
    real_smoke, real_executor = runner.smoke_test, runner.make_executor
    monkeypatch.setattr(runner, "smoke_test", lambda cell: smoke_tests.append(cell.mechanism)
                        or real_smoke(cell))  # fmt: skip
    monkeypatch.setattr(runner, "make_executor", lambda *a, **k: executors.append(a)
                        or real_executor(*a, **k))  # fmt: skip
    mechanisms = (STD, with_heads(STD, "std4", 4))
    spec = load_grid(search_grid(tmp_path, "trials = 3", LR, mechanisms=mechanisms))
    assert run_search(spec, workers=1, out=io.StringIO())["done"] == 6  # six rounds
    assert sorted(smoke_tests) == ["std", "std4"] and len(executors) == 1


def test_a_pruner_needs_the_local_executor(tmp_path):
    spec = load_grid(search_grid(tmp_path, "trials = 2", LR, 'pruner = "median"'))
    with pytest.raises(SpecError, match="search.pruner = 'median' needs executor 'local'"):
        run_search(spec, executor="ray", out=io.StringIO())
    assert not spec.store.exists()  # before any cell


# workers=1: a thread of this process; 2: worker processes (spawned: slow-marked)
@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_cell_that_asks_stops_where_the_driver_answers_prune(tmp_path, workers):
    training = {"steps": 40, "eval_every": 5}
    (cell,) = load_grid(tiny_grid(tmp_path, seeds=[0], mechanisms=[STD], training=training)).cells
    pool = LocalExecutor(workers)
    asked, outcomes = [], []
    try:
        handles = [pool.submit(cell, False, asks=True)]
        while not outcomes:
            outcomes += pool.wait(handles, timeout=1.0)
            pool.drain()
            for question in pool.questions():
                asked.append(question.step)
                pool.answer(question.key, question.step >= 15)
    finally:
        pool.close()
    ((_, outcome),) = outcomes
    assert asked == [5, 10, 15] and outcome.status == "pruned"
    assert outcome.metrics["pruned_at"] == 15 and [p[0] for p in outcome.curve] == [5, 10, 15]
