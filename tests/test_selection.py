"""Best-setting selection, confidence intervals, paired differences and their tests (paired t,
Holm, TOST: ablations.report.selection), the grid's [selection] checks, and the report's selection
section from a real sweep grid."""

import json
import math
import os
import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest
from grids import STD, assert_refused, tiny_grid
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from ablations.cli import main
from ablations.grid.spec import load_grid
from ablations.report import attention_maps, sections, selection_section
from ablations.report.build import write_report
from ablations.report.selection import (
    axis_columns,
    detectable_effect,
    holm,
    interval,
    paired,
    select,
    t_test_p,
    tost_p,
    varying_settings,
    verdicts,
)
from ablations.report.tables import tidy_cells
from ablations.results.axes import GridAxes
from ablations.results.cells_file import CellsFile
from ablations.results.store import ResultsStore, StoreError
from ablations.run.runner import run_grid


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=12))
def test_interval_is_the_one_sample_t_interval(values):
    mean, low, high, n = interval(pd.Series(values))
    assert n == len(values) and math.isclose(mean, sum(values) / n, abs_tol=1e-12)
    if len(set(values)) > 1:
        expected = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
        assert math.isclose(low, expected.low, abs_tol=1e-9)
        assert math.isclose(high, expected.high, abs_tol=1e-9)
    assert low <= mean <= high


def test_one_value_has_no_interval():
    mean, low, high, n = interval(pd.Series([0.5, float("nan")]))
    assert (mean, n) == (0.5, 1) and math.isnan(low) and math.isnan(high)


def test_holm_on_a_hand_worked_family():
    # m = 4 tests (NaN: no test). Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06,
    # 0.04 x 1 = 0.04 -> 0.06 (made non-decreasing); in the family's order:
    p = pd.Series([0.01, 0.04, 0.03, float("nan"), 0.005], index=[5, 3, 9, 1, 0])
    adjusted = holm(p)
    assert list(adjusted.index) == [5, 3, 9, 1, 0]
    assert adjusted.iloc[[0, 1, 2, 4]].tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert math.isnan(adjusted.loc[1])
    assert holm(pd.Series([0.5, 0.6])).tolist() == [1.0, 1.0]  # 0.5 x 2 = 1; capped, monotone
    assert holm(pd.Series([0.02])).tolist() == [0.02]  # a family of one: unadjusted
    assert holm(pd.Series([], dtype=float)).empty


def test_holm_agrees_with_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(0)
    families = [[0.3], [0.01, 0.01, 0.04, 0.5], rng.uniform(0, 0.1, 30), rng.uniform(0, 1, 182)]
    for p_values in families:  # ties, one test, small and large families, capping at 1
        expected = multitest.multipletests(p_values, alpha=0.05, method="holm")[1]
        assert holm(pd.Series(p_values)).tolist() == pytest.approx(list(expected), rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=2, max_size=10))
def test_the_paired_t_test_is_scipys_and_agrees_with_the_interval(differences):
    values = pd.Series(differences)
    p = t_test_p(values)
    _, low, high, _ = interval(values)
    if values.std() > 1e-9 * max(1.0, values.abs().max()):
        assert p == pytest.approx(stats.ttest_1samp(differences, 0.0).pvalue, rel=1e-9)
        if abs(p - 0.05) > 1e-9:  # p < 0.05 exactly where the 95% interval excludes 0
            assert (p < 0.05) == (low > 0 or high < 0)


def test_equal_differences_and_single_seeds():
    assert t_test_p(pd.Series([0.5, 0.5, 0.5])) == 0.0  # the interval [0.5, 0.5] excludes 0
    assert t_test_p(pd.Series([0.0, 0.0])) == 1.0  # seed for seed the same: no difference
    assert math.isnan(t_test_p(pd.Series([0.3]))) and math.isnan(tost_p(pd.Series([0.3]), 1))
    assert tost_p(pd.Series([0.0, 0.0]), 0.01) == 0.0 and tost_p(pd.Series([0.25] * 3), 0.1) == 1


def t2_cdf(t):
    """Student's t CDF with 2 degrees of freedom, in closed form: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def test_tost_on_a_hand_worked_case():
    values = pd.Series([0.01, 0.02, 0.03])  # mean 0.02, s 0.01, n 3: se = 0.01 / sqrt(3)
    se = 0.01 / math.sqrt(3)
    # margin 0.05: against mean <= -0.05, t = 0.07 / se = 12.12 (p 0.0034); against mean >= 0.05,
    # t = -0.03 / se = -5.20 (p 0.0175); the TOST p is the larger
    expected = max(1 - t2_cdf(0.07 / se), t2_cdf(-0.03 / se))
    assert tost_p(values, 0.05) == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(0.01755, abs=1e-5)
    assert tost_p(values, 0.03) == pytest.approx(t2_cdf(-0.01 / se), rel=1e-9)  # 0.113
    for margin in (0.03, 0.04, 0.05, 0.1):  # p < 0.05 exactly where the 90% interval is inside
        _, low, high, _ = interval(values, level=0.90)
        assert (tost_p(values, margin) < 0.05) == (-margin < low and high < margin)


def family(rows, margin=None, effect=None):
    """`verdicts` of a made-up family: rows of (a, b, mean, p, tost_p[, reported]), reported
    test_acc where a row leaves it out; 5 seeds whose differences have sd 0.04."""
    rows = [(*row, "test_acc") if len(row) == 5 else row for row in rows]
    frame = pd.DataFrame(rows, columns=["a", "b", "mean", "p", "tost_p", "reported"])
    return verdicts(frame.assign(n=5, sd=0.04, incomplete=""), margin, effect)


def test_verdicts_use_the_holm_adjusted_p_and_say_equivalent_only_with_a_margin():
    rows = [
        ("x", "y", 0.30, 0.001, 0.9),  # x ahead: 0.001 x 4 = 0.004
        ("x", "y", -0.20, 0.004, 0.9),  # y ahead: 0.004 x 3 = 0.012
        ("x", "y", 0.05, 0.02, 0.9),  # x ahead: 0.02 x 2 = 0.04
        ("x", "y", 0.01, 0.30, 0.001),  # no difference shown; equivalent with a margin
        ("x", "y", 0.01, float("nan"), float("nan")),  # n < 2: no test
    ]
    plain = family(rows)
    assert plain.p_holm.tolist()[:4] == pytest.approx([0.004, 0.012, 0.04, 0.30])
    assert plain.verdict.tolist()[:3] == ["x ahead", "y ahead", "x ahead"]
    assert plain.verdict[3].startswith("no clear difference (detectable ±")
    assert plain.verdict[4] == "-"
    rows[2] = ("x", "y", 0.05, 0.03, 0.9)  # 0.03 x 2 = 0.06: not below 0.05 after Holm
    with_margin = family(rows, margin=0.02)
    assert with_margin.verdict.tolist()[:2] == ["x ahead", "y ahead"]
    assert with_margin.verdict[2].startswith("no clear difference")
    assert with_margin.verdict.tolist()[3:] == ["equivalent within ±0.02", "-"]
    assert with_margin.tost_p_holm.tolist()[:4] == pytest.approx([1.0, 1.0, 1.0, 0.004])
    both = family([("x", "y", 0.01, 0.001, 0.001)], margin=0.02)
    assert both.verdict.tolist() == ["x ahead, by less than 0.02"]
    assert not family(rows).verdict.str.contains("equivalent|by less").any()  # no margin


@pytest.mark.parametrize(
    ("sd", "n", "level"), [(0.04, 5, 0.05 / 4), (0.03, 10, 0.05), (1.0, 3, 0.01)]
)
def test_the_detectable_effect_is_found_with_80_percent_power_by_simulation(sd, n, level):
    """Independently of the noncentral t: 20,000 made-up designs whose true difference is the
    detectable effect; the paired t test at `level` finds it in 80% of them (±1.5%)."""
    effect = detectable_effect(sd, n, level)
    rng = np.random.default_rng(0)
    differences = rng.normal(effect, sd, size=(20_000, n))
    found = stats.ttest_1samp(differences, 0.0, axis=1).pvalue < level
    assert found.mean() == pytest.approx(0.8, abs=0.015)
    assert detectable_effect(sd, n, level / 10) > effect  # a stricter level needs a larger one
    assert detectable_effect(0.0, n, level) == 0.0
    assert math.isnan(detectable_effect(sd, 1, level))


def test_every_seed_the_same_difference_reads_as_such_not_as_a_test():
    """The hostile pass: differences [0, 0, 0] read "no clear difference (detectable ±0)"
    (22 rows of relational_games, both models at the ceiling) and [0.02] x 3 "x ahead" on a
    p of 0: a t test has no spread to work with."""
    rows = pd.DataFrame(
        [("x", "y", 0.0, 1.0), ("x", "y", 0.02, 0.0), ("x", "y", -0.02, 0.0)],
        columns=["a", "b", "mean", "p"],
    )
    frame = rows.assign(tost_p=math.nan, reported="test_acc", n=3, sd=0.0, incomplete="")
    assert verdicts(frame).verdict.tolist() == [
        "identical on every seed (no spread: nothing to test)",
        "x ahead on every seed by the same 0.02 (no spread: the t test does not apply)",
        "y ahead on every seed by the same 0.02 (no spread: the t test does not apply)",
    ]


def test_a_no_clear_difference_smaller_than_the_effect_of_interest_reads_underpowered():
    """Found on relations_game_between: 5 seeds, differences with sd 0.03-0.08, detectable
    effects of 0.05-0.14, read as 'no clear difference' beside the paper's gaps."""
    rows = [("x", "y", 0.02, 0.40, 0.9), ("x", "y", 0.01, 0.50, 0.9)]
    d = family(rows).detectable[0]
    assert d == pytest.approx(detectable_effect(0.04, 5, 0.05 / 2))
    small, large = family(rows, effect=d / 2), family(rows, effect=d * 2)
    assert small.verdict[0] == f"underpowered (detectable ±{d:.3g} > ±{d / 2:g} of interest)"
    assert large.verdict[0] == f"no clear difference (detectable ±{d:.3g})"


def test_a_verdict_on_a_loss_names_the_mechanism_with_the_lower_loss():
    """Found in a partly run report: linear − standard +1.10 test bits per character (linear
    the worse) read "linear ahead": the verdict took a positive difference as a's advantage
    whatever the metric."""
    rows = [
        ("x", "y", 0.30, 0.001, 0.9, "test_loss"),  # x's loss higher: y ahead
        ("x", "y", -0.30, 0.001, 0.9, "test_bits"),  # x's bits lower: x ahead
        ("x", "y", 0.30, 0.001, 0.9, "test_acc"),  # x's accuracy higher: x ahead
        ("x", "y", -0.30, 0.001, 0.9, "test_ood_acc"),
    ]
    assert family(rows).verdict.tolist() == ["y ahead", "x ahead", "x ahead", "y ahead"]
    both = family([("x", "y", 0.01, 0.001, 0.001, "val_loss")], margin=0.02)
    assert both.verdict.tolist() == ["y ahead, by less than 0.02"]


def test_paired_rows_name_the_metric_they_differ_in():
    cells = cells_frame(ROWS)
    chosen = select(cells, ["training.lr"], "val_acc", "test_acc")
    rows = paired(cells, chosen, "a", "b", "test_acc")
    assert rows.reported.tolist() == ["test_acc"]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("0", "= 0 must"), ("-0.01", "= -0.01 must"), ("nan", "= nan must"), ("inf", "= inf must"),
     ("'0.02'", "= '0.02' must"), ("true", "= True must"), ("[0.02]", "= [0.02] must")],
)  # fmt: skip
@pytest.mark.parametrize("key", ["equivalence_margin", "effect_of_interest"])
def test_a_bad_margin_or_effect_is_refused_naming_it_and_what_is_valid(
    tmp_path, value, fragment, key
):
    path = tiny_grid(tmp_path)
    path.write_text(path.read_text() + f"[selection]\n{key} = {value}\n")
    assert_refused(path, [f"selection.{key} {fragment}", "a finite float > 0", "units"])


@pytest.mark.parametrize("key", ["equivalence_margin", "effect_of_interest"])
def test_a_margin_or_effect_is_refused_for_accuracies_and_losses_together(tmp_path, key):
    path = tiny_grid(tmp_path)
    path.write_text(path.read_text() + '[selection]\nreported = ["test_acc", "test_loss"]\n'
                    f"{key} = 0.02\n")  # fmt: skip
    assert_refused(path, [f"selection.{key} = 0.02", "mixes losses (test_loss)"])
    path.write_text(path.read_text().replace('"test_loss"', '"test_exact"'))
    assert getattr(load_grid(path).selection, key) == 0.02


def test_a_report_gives_each_comparison_its_detectable_effect(swept_store, tmp_path):
    selection = swept_store.selection.model_copy(update={"effect_of_interest": 1e-6})
    out = write_report(swept_store.store, tmp_path / "power", selection=selection)
    pairs = pd.read_csv(out / "paired.csv")
    (row,) = pairs.itertuples()
    assert row.detectable == pytest.approx(detectable_effect(row.sd, row.n, 0.05))
    assert row.effect_of_interest == 1e-6
    assert row.verdict.startswith(("underpowered (detectable ±", "rel ahead", "std ahead"))
    text = (out / "report.md").read_text()
    assert "detectable (80% power)" in text and "effect_of_interest is ±1e-06" in text


def test_a_long_verdict_table_leads_as_counts_per_pair_and_is_shown_whole_below(
    swept_store, tmp_path, monkeypatch
):
    """A verdict table taller than the screen (relational_games: 88 rows) pushed the headline
    figure off the first screen: past LEAD_ROWS rows, the lead counts each pair's verdicts and
    the rows are in a details section of their own."""
    monkeypatch.setattr(selection_section, "LEAD_ROWS", 0)  # the one row counts as many
    out = write_report(swept_store.store, tmp_path / "long", selection=swept_store.selection)
    (row,) = pd.read_csv(out / "paired.csv").itertuples()
    verdict = row.verdict.split(" (")[0]
    text = (out / "report.md").read_text()
    lead, details = text.split("## Every comparison (1 rows)")
    assert f"| rel − std | 1 | 1 {verdict} | ±{row.detectable:.3g} |" in lead
    assert lead.index("| a − b | comparisons | verdicts |") < lead.index("headline figure")
    assert "| p Holm |" not in lead and "| p Holm |" in details  # the row-by-row table
    assert details.index("| p Holm |") < details.index("## Selection")


def cells_frame(rows):
    """Cells as the report's tidy frame: task, size, mechanism, seed, status, axes, metrics."""
    frame = pd.DataFrame(rows, columns=["mechanism", "training.lr", "seed", "status", "val_acc",
                                        "test_acc"])  # fmt: skip
    return frame.assign(task="t", size="s")


ROWS = [
    # mechanism a: lr 0.1 has the best validation mean, but a seed failed: not eligible
    ("a", 0.1, 0, "done", 0.99, 0.99), ("a", 0.1, 1, "failed", None, None),
    ("a", 0.01, 0, "done", 0.80, 0.70), ("a", 0.01, 1, "done", 0.90, 0.74),
    ("a", 0.001, 0, "done", 0.60, 0.95), ("a", 0.001, 1, "done", 0.62, 0.96),
    ("b", 0.1, 0, "done", 0.50, 0.60), ("b", 0.1, 1, "done", 0.52, 0.64),
    ("b", 0.01, 0, "done", 0.55, 0.50), ("b", 0.01, 1, "done", 0.53, 0.52),
]  # fmt: skip


def test_a_choice_at_the_edge_of_its_sweep_is_flagged():
    """Found as a new user: every mechanism at the top learning rate of a small grid, passed
    silently. a's 0.01 lies inside the values tried (0.1 counts, though it failed); b's 0.01 is
    the lowest of two: flagged."""
    chosen = select(cells_frame(ROWS), ["training.lr"], "val_acc", "test_acc")
    assert chosen.set_index("mechanism").edge.to_dict() == {
        "a": "", "b": "training.lr=0.01 the lowest tried"
    }  # fmt: skip
    lowest = [row for row in ROWS if row[0] == "a" and row[1] != 0.01]  # 0.001 of 0.1, 0.001
    assert select(cells_frame(lowest), ["training.lr"], "val_acc", "test_acc").edge[0] == (
        "training.lr=0.001 the lowest tried"
    )


def test_select_takes_the_best_validation_mean_among_settings_every_seed_finished():
    cells = cells_frame(ROWS)
    chosen = select(cells, ["training.lr"], "val_acc", "test_acc").set_index("mechanism")
    # a: 0.01 (val 0.85) beats 0.001 (val 0.61) although 0.001 tests higher; 0.1 is ineligible
    assert chosen.loc["a", "best"] == "training.lr=0.01"
    assert chosen.loc["a", "candidates"] == 2 and chosen.loc["a", "settings"] == 3
    assert math.isclose(chosen.loc["a", "mean"], 0.72)
    assert chosen.loc["b", "best"] == "training.lr=0.01"  # 0.54 > 0.51
    by_loss = cells.assign(val_loss=1 - cells.val_acc)
    lowest = select(by_loss, ["training.lr"], "val_loss", "test_acc").set_index("mechanism")
    assert lowest.loc["a", "best"] == "training.lr=0.01"  # the lowest loss, not the highest


def test_paired_difference_is_seed_by_seed_at_each_mechanisms_own_best():
    cells = cells_frame(ROWS)
    chosen = select(cells, ["training.lr"], "val_acc", "test_acc")
    diff = paired(cells, chosen, "a", "b", "test_acc").iloc[0]
    per_seed = pd.Series([0.70 - 0.50, 0.74 - 0.52])
    expected = interval(per_seed)
    assert diff.n == 2 and math.isclose(diff["mean"], expected[0])
    assert math.isclose(diff.low, expected[1]) and math.isclose(diff.high, expected[2])


def test_other_axes_are_selected_separately():
    rows = [(m, lr, seed, "done", v, v) for m in "ab" for lr in (0.1, 0.01) for seed in (0, 1)
            for v in [lr * (2 if m == "a" else 1)]]  # fmt: skip
    cells = cells_frame(rows)
    cells["model.pos_enc"] = ["rope", "learned"] * (len(cells) // 2)
    chosen = select(cells, ["training.lr"], "val_acc", "test_acc")
    assert len(chosen) == 4 and set(chosen.others) == {"model.pos_enc=rope",
                                                       "model.pos_enc=learned"}  # fmt: skip


def test_axes_are_the_settings_that_vary_within_a_mechanism(tmp_path):
    path = tiny_grid(tmp_path, seeds=[0], mechanisms=[STD])
    path.write_text(path.read_text() + "[sweep]\ntraining.patience = [0, 2]\n")
    store = ResultsStore(tmp_path / "tiny.sqlite")
    for cell in load_grid(path).cells:
        store.finish(store.claim(cell.config()), "done", {}, [], {})
    found = varying_settings(store.to_dataframe())
    assert list(found.columns) == ["training.patience"]  # not n_train, lr, ...: they do not vary
    assert sorted(found["training.patience"]) == ["0", "2"]  # 0: left out of the key, default


def test_a_report_names_settings_alike_for_cells_stored_and_cells_not_run(tmp_path):
    path = tiny_grid(tmp_path, seeds=[0, 1], mechanisms=[STD])
    path.write_text(path.read_text() + "[sweep]\ntraining.patience = [0, 2]\n")
    spec = load_grid(path)
    store = ResultsStore(spec.store)
    for cell in spec.cells:  # seed 1 not run
        if cell.seed == 0:
            store.finish(store.claim(cell.config()), "done", {"test_acc": 0.5}, [], {})
    keys = {cell.key: cell.config() for cell in spec.cells}
    out = write_report(spec.store, tmp_path / "report", keys=keys)
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary.setting) == ["training.patience=0", "training.patience=2"]  # not 2.0
    assert list(summary.cells) == [2, 2] and list(summary.seeds) == [1, 1]


def test_steps_an_epoch_count_resolves_to_are_not_an_axis(tmp_path):
    path = tiny_grid(
        tmp_path, seeds=[0], mechanisms=[STD], training={"epochs": 2, "warmup_steps": 0}
    )
    text = path.read_text().replace("steps = 20\n", "")  # epochs instead of steps
    path.write_text(text + "[sweep]\ntask_kwargs.n_train = [64, 128]\n")
    store = ResultsStore(tmp_path / "tiny.sqlite")
    cells = load_grid(path).cells
    assert len({cell.training.steps for cell in cells}) == 2  # the steps do vary
    for cell in cells:
        store.finish(store.claim(cell.config()), "done", {}, [], {})
    assert list(varying_settings(store.to_dataframe()).columns) == ["task_kwargs.n_train"]


def swept_grid(tmp_path, sweep_and_selection: str):
    """The tiny grid (2 seeds, 10 steps, warmed up over 9: cells that learn a little, each
    seed its own amount) with `sweep_and_selection` (TOML) appended, trained."""
    training = {"steps": 10, "eval_every": 5, "warmup_steps": 9}
    path = tiny_grid(tmp_path, seeds=[0, 1], training=training)
    path.write_text(path.read_text() + sweep_and_selection)
    spec = load_grid(path)
    run_grid(spec, workers=1)
    return spec


def record_plots(monkeypatch, *names: str) -> dict[str, list]:
    """Each of report/sections.py's plot functions `names` recording (label, frame) per call."""
    drawn = {name: [] for name in names}
    for name in names:
        real = getattr(sections, name)

        def recording(label, frame, *args, real=real, name=name, **kwargs):
            drawn[name].append((label, frame))
            return real(label, frame, *args, **kwargs)

        monkeypatch.setattr(sections, name, recording)
    return drawn


@pytest.fixture(scope="module")
def swept_store(tmp_path_factory):
    return swept_grid(
        tmp_path_factory.mktemp("sweep"),
        "[sweep]\ntraining.lr = [1e-3, 3e-3]\n"
        '[selection]\nover = ["training.lr"]\ncompare = [["rel", "std"]]\n',
    )


@pytest.fixture(scope="module")
def n_train_swept(tmp_path_factory):
    """Learning rate and n_train swept, the selection over the learning rate only."""
    return swept_grid(
        tmp_path_factory.mktemp("n_train"),
        "[sweep]\ntraining.lr = [1e-3, 3e-2]\ntask_kwargs.n_train = [64, 128]\n"
        '[selection]\nover = ["training.lr"]\n',
    )


def test_a_report_with_a_selection_compares_each_mechanism_at_its_best_lr(swept_store, tmp_path):
    spec = swept_store
    out = write_report(spec.store, tmp_path / "report", selection=spec.selection)
    chosen = pd.read_csv(out / "selection.csv")
    assert sorted(chosen.mechanism) == ["rel", "std"] and set(chosen.n) == {2}
    assert set(chosen.best) <= {"training.lr=0.001", "training.lr=0.003"}
    pairs = pd.read_csv(out / "paired.csv")
    assert list(pairs[["a", "b", "n"]].itertuples(index=False, name=None)) == [("rel", "std", 2)]
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 4 and summary.setting.str.startswith("training.lr=").all()
    text = (out / "report.md").read_text()
    assert "## Selection: each mechanism at its best setting" in text and "rel − std" in text


def test_task_plots_draw_each_mechanisms_selected_setting_only(swept_store, tmp_path, monkeypatch):
    drawn = record_plots(monkeypatch, "plot_curves", "plot_vs_params")
    out = write_report(swept_store.store, tmp_path / "report", selection=swept_store.selection)
    selected = pd.read_csv(out / "selection.csv")
    chosen = set(zip(selected.mechanism, selected.best, strict=True))
    [(_, curves)], [(_, points)] = drawn["plot_curves"], drawn["plot_vs_params"]
    assert len(curves) == 4  # 2 mechanisms x 2 seeds, of the 8 cells
    assert set(zip(curves.mechanism, "training.lr=" + curves["training.lr"], strict=True)) == chosen
    assert len(points) == 4 and set(zip(points.mechanism, points.setting, strict=True)) == chosen
    assert pd.read_csv(out / "summary.csv").shape[0] == 4  # the table keeps every setting


def test_the_parameters_plot_shows_the_reported_metric(swept_store, tmp_path, monkeypatch):
    figures, real = [], sections.plot_vs_params
    monkeypatch.setattr(
        sections, "plot_vs_params", lambda *a, **k: figures.append(real(*a, **k)) or figures[-1]
    )
    selection = swept_store.selection.model_copy(update={"reported": "test_loss"})
    out = write_report(swept_store.store, tmp_path / "loss", selection=selection)
    [ax] = figures[0].axes
    assert ax.get_ylabel() == "test loss"
    chosen = pd.read_csv(out / "selection.csv").set_index("mechanism")
    plotted = sorted(bars.lines[0].get_ydata()[0] for bars in ax.containers)  # the points
    assert plotted == pytest.approx(sorted(chosen["mean"]))  # each mechanism's selected test loss


def test_a_selection_reports_each_metric_it_names_at_the_same_settings(swept_store, tmp_path):
    selection = swept_store.selection.model_copy(update={"reported": ["test_acc", "test_loss"]})
    out = write_report(swept_store.store, tmp_path / "two", selection=selection)
    chosen = pd.read_csv(out / "selection.csv")
    by_metric = {name: rows.set_index("mechanism") for name, rows in chosen.groupby("reported")}
    assert set(by_metric) == {"test_acc", "test_loss"}
    assert by_metric["test_acc"].best.equals(by_metric["test_loss"].best)
    cells = pd.read_csv(out / "cells.csv")
    for mechanism, row in by_metric["test_loss"].iterrows():
        lr = float(row.best.removeprefix("training.lr="))
        mine = (cells["mechanism"] == mechanism) & (cells["training.lr"] == lr)
        assert row["mean"] == pytest.approx(cells[mine]["metrics.test_loss"].mean())
    pairs = pd.read_csv(out / "paired.csv")
    assert sorted(pairs.reported) == ["test_acc", "test_loss"]
    text = (out / "report.md").read_text()
    assert "test_acc \\[95% CI\\]" in text and "test_loss \\[95% CI\\]" in text  # [ ] escaped
    assert "test_loss verdict" in text


def test_a_reported_metric_no_cell_has_is_an_error_naming_it(swept_store, tmp_path):
    selection = swept_store.selection.model_copy(update={"reported": "test_ood_acc"})
    with pytest.raises(ValueError, match=r"'test_ood_acc', which no cell .* test_acc"):
        write_report(swept_store.store, tmp_path / "bad", selection=selection)


def test_a_report_without_a_selection_has_no_selection_section(swept_store, tmp_path):
    store = tmp_path / "copy.sqlite"  # the same cells, the axes recorded without a selection
    shutil.copy(swept_store.store, store)
    ResultsStore(store).record_axes(swept_store.name, GridAxes(("training.lr",)))
    out = write_report(store, tmp_path / "plain")
    assert not (out / "selection.csv").exists()
    assert "Selection" not in (out / "report.md").read_text()


def test_a_run_keeps_its_grids_axes_and_a_report_of_the_store_alone_reads_them(
    swept_store, tmp_path
):
    spec = swept_store
    recorded = ResultsStore(spec.store, readonly=True).axes()
    assert recorded == {spec.name: GridAxes(("training.lr",), spec.selection.model_dump())}
    given = write_report(spec.store, tmp_path / "given", selection=spec.selection)
    alone = write_report(spec.store, tmp_path / "alone")  # no grid, no selection argument
    for name in ("selection.csv", "paired.csv", "summary.csv"):
        assert (alone / name).read_bytes() == (given / name).read_bytes()
    provenance = json.loads((alone / "provenance.json").read_text())
    assert provenance["axes"] == {spec.name: recorded[spec.name].to_json()}
    rebuilt = tmp_path / "rebuilt"  # from the report's cells.csv alone: its provenance.json
    main(["report", str(alone / "cells.csv"), "--out", str(rebuilt)])
    for name in ("selection.csv", "paired.csv", "summary.csv", "cells.csv"):
        assert (rebuilt / name).read_bytes() == (given / name).read_bytes()
    assert json.loads((rebuilt / "provenance.json").read_text())["axes"] == provenance["axes"]


def test_a_store_older_than_the_record_finds_its_axes_as_the_settings_that_vary(
    swept_store, tmp_path
):
    store = tmp_path / "old.sqlite"
    shutil.copy(swept_store.store, store)
    with sqlite3.connect(store) as db:
        db.execute("DROP TABLE grids")
    os.chmod(store, 0o444)  # read-only: reading the axes creates nothing
    assert ResultsStore(store, readonly=True).axes() == {}
    out = write_report(store, tmp_path / "old")
    assert not (out / "selection.csv").exists()  # no selection without a grid or a record
    assert set(pd.read_csv(out / "summary.csv").setting.str.split("=").str[0]) == {"training.lr"}
    assert json.loads((out / "provenance.json").read_text())["axes"] == {}


def test_a_setting_no_grid_sweeps_is_kept_apart_and_named(swept_store, tmp_path):
    store = tmp_path / "unswept.sqlite"  # as if the grid swept nothing when it last ran
    shutil.copy(swept_store.store, store)
    ResultsStore(store).record_axes(swept_store.name, GridAxes(()))
    out = write_report(store, tmp_path / "unswept")
    assert len(pd.read_csv(out / "summary.csv")) == 4  # the two learning rates not merged
    assert (
        "Not swept by the grid, yet varying among its cells (shown as axes): training.lr"
        in (out / "report.md").read_text()
    )
    plain = write_report(swept_store.store, tmp_path / "plain")
    assert "Not swept by the grid" not in (plain / "report.md").read_text()


def test_the_axis_columns_follow_the_grids_order(n_train_swept):
    frame = ResultsStore(n_train_swept.store, readonly=True).to_dataframe()
    inferred = axis_columns(tidy_cells(frame))
    assert sorted(inferred) == ["task_kwargs.n_train", "training.lr"]
    for order in (inferred, inferred[::-1]):
        cells = tidy_cells(frame, swept=order)
        assert axis_columns(cells) == order
        first, second = order
        assert cells.setting.str.match(rf"{first}=.*, {second}=").all()


def test_recorded_axes_that_are_not_axes_are_an_error_naming_the_store(swept_store, tmp_path):
    store = tmp_path / "bad.sqlite"
    shutil.copy(swept_store.store, store)
    with sqlite3.connect(store) as db:
        db.execute("UPDATE grids SET axes = ?", ('{"swept": "training.lr"}',))
    with pytest.raises(StoreError, match=rf"{store}.*valid: .*swept"):
        ResultsStore(store, readonly=True).axes()
    report = write_report(swept_store.store, tmp_path / "report")
    provenance = report / "provenance.json"
    provenance.write_text(provenance.read_text().replace('"swept": [', '"swept": [1, '))
    with pytest.raises(ValueError, match=r"provenance.json .*holds the axes"):
        CellsFile(report / "cells.csv")


def test_a_grid_report_holds_the_grids_cells_only(swept_store, tmp_path):
    spec = swept_store  # 2 mechanisms x 2 lr x 2 seeds, all done
    out = tmp_path / "narrowed"
    main(["report", str(spec.path), "--out", str(out), "--set", "sweep.training.lr=[1e-3]"])
    assert len(pd.read_csv(out / "cells.csv")) == 4
    assert (
        "Left out: 4 cells of the store that are not in the grid" in (out / "report.md").read_text()
    )
    main(["report", str(spec.store), "--out", str(tmp_path / "whole")])  # a store: every cell
    assert len(pd.read_csv(tmp_path / "whole" / "cells.csv")) == 8


def test_attention_maps_show_each_mechanisms_selected_setting(tmp_path, monkeypatch):
    path = tiny_grid(tmp_path, seeds=[0, 1], training={"steps": 10, "eval_every": 5},
                     checkpoints=True)  # fmt: skip
    path.write_text(path.read_text() + "[sweep]\ntraining.lr = [1e-3, 3e-3]\n"
                    '[selection]\nover = ["training.lr"]\n')  # fmt: skip
    spec = load_grid(path)
    run_grid(spec, workers=1)
    loaded = []
    real = attention_maps.load_cell_maps

    def recording(store, row):
        loaded.append(row["key"])
        return real(store, row)

    monkeypatch.setattr(attention_maps, "load_cell_maps", recording)
    out = write_report(spec.store, tmp_path / "report", selection=spec.selection)
    chosen = pd.read_csv(out / "selection.csv").set_index("mechanism").best
    want = {
        cell.key for cell in spec.cells
        if cell.seed == 0 and f"training.lr={cell.training.lr}" == chosen[cell.mechanism]
    }  # fmt: skip
    assert sorted(loaded) == sorted(want) and len(want) == 2


def test_training_set_size_curves_show_each_mechanism_at_its_selected_setting(
    n_train_swept, tmp_path
):
    spec = n_train_swept
    out = write_report(spec.store, tmp_path / "report", selection=spec.selection)
    chosen = pd.read_csv(out / "selection.csv")
    text = (out / "report.md").read_text()
    section = text[text.index("## Training-set size") :]
    assert section.count("## Training-set size") == 1  # not one section per learning rate
    for row in chosen.itertuples():
        n_train = row.others.split("task_kwargs.n_train=")[1].split(",")[0]
        line = next(x for x in section.splitlines() if x.startswith(f"| {n_train} |"))
        cells = dict(zip(["std", "rel"], line.split("|")[3:5], strict=True))
        assert f"{row.mean:.3f} \\[{row.low:.3f}, {row.high:.3f}\\] (n=2)" in cells[row.mechanism]


def test_with_other_axes_each_of_their_settings_gets_its_own_learning_curves(
    n_train_swept, tmp_path, monkeypatch
):
    spec = n_train_swept
    drawn = record_plots(monkeypatch, "plot_curves")["plot_curves"]
    out = write_report(spec.store, tmp_path / "report", selection=spec.selection)
    chosen = pd.read_csv(out / "selection.csv")
    assert [label for label, _ in drawn] == [
        "same_pair; task_kwargs.n_train=64", "same_pair; task_kwargs.n_train=128"
    ]  # fmt: skip
    for (_, done), n_train in zip(drawn, ("64", "128"), strict=True):
        assert set(done["task_kwargs.n_train"]) == {n_train} and len(done) == 4  # 2 x 2 seeds
        mine = chosen[chosen.others == f"task_kwargs.n_train={n_train}"]
        best = dict(zip(mine.mechanism, mine.best, strict=True))
        assert all(best[m] == s for m, s in zip(done.mechanism, done.setting, strict=True))
    text = (out / "report.md").read_text()
    assert text.count("learning curves](curves_") == 2
