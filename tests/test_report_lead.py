"""A report leads with its answer: the question (the grid's [report], else read from its
[selection]), the verdict table and the headline figure (each mechanism at its selected setting
against the grid's main axis, its 95% band, a reference file's curves dashed), the note, then
the details; the [report] travels in provenance.json, so a rebuild from cells.csv alone keeps
it; a pair with a cell still to finish gets no verdict. Stores written by hand: no training."""

import json
import re

import pandas as pd
import pytest
from grids import tiny_grid
from test_report_safety import ENVIRONMENT, config

import ablations.report.sections
from ablations.cli import main
from ablations.grid.schema import ReferenceCurve, ReportSettings, Selection
from ablations.grid.spec import load_grid
from ablations.report.build import write_report
from ablations.report.figures import reference_rows
from ablations.report.headline import read_reference
from ablations.report.pages import label_colours
from ablations.results.axes import GridAxes
from ablations.results.store import ResultsStore

N_TRAIN = [100, 200, 400]
SELECTION = Selection(over=["training.lr"], compare=[["dual", "standard"]])
QUESTION = "Does dual learn from fewer examples than standard?"
REFERENCE = "task,model,n_train,acc\nsame_pair,paper DAT,100,0.7\nsame_pair,paper DAT,300,0.8\n"


def accuracy(mechanism: str, n_train: int, lr: float, seed: int) -> float:
    """Made-up accuracies: dual ahead (by 0.05 to 0.07, by seed), more data better, lr 1e-3
    the better one."""
    dual = (0.05 + seed**2 / 200) * (mechanism == "dual")
    return 0.5 + n_train / 1000 + dual + seed / 100 - (lr > 1e-3) / 10


def cell(mechanism: str, n_train: int, lr: float, seed: int) -> dict:
    return config(
        mechanism=mechanism, seed=seed,
        task_kwargs={"n_train": n_train, "n_validation": 16, "n_test": 16},
        training={"steps": 40, "batch_size": 8, "lr": lr},
    )  # fmt: skip


def sweep_store(path, unfinished: tuple = ()) -> ResultsStore:
    """Two mechanisms x n_train x two learning rates x 3 seeds, done; the cells `unfinished`
    ((mechanism, n_train, lr, seed)) claimed and still running. The grid's axes recorded."""
    store = ResultsStore(path)
    for mechanism in ("dual", "standard"):
        for n_train in N_TRAIN:
            for lr in (1e-3, 3e-3):
                for seed in range(3):
                    key = store.claim(cell(mechanism, n_train, lr, seed))
                    if (mechanism, n_train, lr, seed) in unfinished:
                        continue
                    acc = accuracy(mechanism, n_train, lr, seed)
                    metrics = {"steps": 40, "params": 1000, "step_ms": 1.0, "test_acc": acc,
                               "val_acc": acc}  # fmt: skip
                    curve = [[step, 1 - acc, 1 - acc, acc * step / 40] for step in (20, 40)]
                    store.finish(key, "done", metrics, curve, ENVIRONMENT)
    axes = GridAxes(("task_kwargs.n_train", "training.lr"), SELECTION.model_dump(mode="json"))
    store.record_axes("safety", axes)
    return store


@pytest.fixture(scope="module")
def lead(tmp_path_factory):
    """A report of the sweep with a [report]: question and a reference file beside its grid;
    the headline figure kept."""
    folder = tmp_path_factory.mktemp("lead")
    grid = folder / "grid.toml"
    grid.write_text("# the grid file: its [report]'s files lie beside it\n")
    (folder / "ref.csv").write_text("# the paper's curve\n" + REFERENCE)
    curve = ReferenceCurve(file="ref.csv", label="paper", source="Doe 2024, fig. 1", column="acc")
    report = ReportSettings(question=QUESTION, reference_curves=[curve])
    figures, real = [], ablations.report.sections.plot_headline
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ablations.report.sections, "plot_headline",
                      lambda *a, **k: figures.append(real(*a, **k)) or figures[-1])  # fmt: skip
        store = sweep_store(folder / "s.sqlite").path
        note = "**Conclusion**: dual is ahead."
        out = write_report(store, folder / "out", note=note, grid=grid, report=report)
    return out, figures[0]


def test_the_page_leads_with_question_verdicts_headline_and_note_then_the_details(lead):
    out, _ = lead
    markdown = (out / "report.md").read_text()
    order = [f"**Question:** {QUESTION}", "## Answer", "| dual − standard |", "](headline.png)",
             "**Conclusion**: dual is ahead.", "## Selection: each mechanism at its best setting",
             "## Task: same_pair", "## Training-set size: same_pair",
             "## Provenance and how to read the tables",
             "## Cells not in the tables"]  # fmt: skip
    at = [markdown.index(text) for text in order]
    assert at == sorted(at), list(zip(order, at, strict=True))
    verdicts = markdown.split("## Answer")[1].split("](headline.png)")[0]
    assert "every row's task: same_pair; every row's size: xs." in verdicts  # no column
    header = re.search(r"(?m)^\| other axes \| a − b .*$", verdicts)[0]
    for column in ("difference \\[95% CI\\]", "p Holm", "detectable (80% power)", "verdict"):
        assert column in header
    assert "| p |" not in header  # the unadjusted p: in paired.csv and the details
    page = (out / "index.html").read_text()
    headline = page.index('alt="test_acc vs task_kwargs.n_train')
    first_details = page.index("<details>")
    assert page.index("Question:") < page.index("<table>") < headline < first_details
    assert page.index("<strong>Conclusion</strong>") < first_details
    assert page.count("<details>") == page.count("</details>") == 5  # all but the answer


def test_the_headline_figure_draws_each_mechanism_at_its_selected_setting_and_the_reference(lead):
    out, figure = lead
    [ax] = [ax for ax in figure.axes if ax.get_visible()]
    chosen = pd.read_csv(out / "selection.csv")
    colours = label_colours(["dual", "standard"])
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend == ["dual", "standard", "paper: paper DAT"]
    for mechanism, rows in chosen.groupby("mechanism"):
        rows = rows.sort_values("task_kwargs.n_train")
        drawn = [line for line in ax.lines if line.get_color() == colours[mechanism]]
        [line] = [line for line in drawn if line.get_linestyle() == "-"]
        assert list(line.get_xdata()) == N_TRAIN
        assert list(line.get_ydata()) == pytest.approx(list(rows["mean"]))
        assert set(rows.best) == {"training.lr=0.001"}  # the better rate, at every n_train
    band = [c for c in ax.collections if c.get_paths()]
    assert len(band) == 2  # a 95% band per mechanism
    [reference] = [line for line in ax.lines if line.get_label() == "paper: paper DAT"]
    assert reference.get_linestyle() == "--" and reference.get_color() == "black"
    assert list(reference.get_xdata()) == [100, 300] and list(reference.get_ydata()) == [0.7, 0.8]
    assert ax.get_xlabel() == "task_kwargs.n_train"
    ticks = [text.get_text() for text in ax.get_xticklabels()]  # the values run, written plain
    assert list(ax.get_xticks()) == N_TRAIN and ticks == ["100", "200", "400"]
    markdown = (out / "report.md").read_text()
    assert "reference curves (paper: Doe 2024, fig. 1)" in markdown


def test_each_of_many_mechanisms_has_a_colour_of_its_own():
    """tab10 alone gave the 11th label the first one's colour."""
    for n in (2, 10, 11, 25):
        colours = label_colours([f"m{i}" for i in range(n)])
        assert len(set(colours.values())) == n


def test_a_rebuild_from_cells_csv_alone_leads_with_the_same_question_and_curves(lead, tmp_path):
    out, _ = lead
    rebuilt = tmp_path / "rebuilt"
    main(["report", str(out / "cells.csv"), "--out", str(rebuilt)])
    before, after = (json.loads((o / "provenance.json").read_text()) for o in (out, rebuilt))
    assert after["report"] == before["report"]
    assert before["report"]["reference_curves"][0]["rows"][1] == {
        "task": "same_pair", "model": "paper DAT", "n_train": 300, "acc": 0.8,
    }  # fmt: skip
    markdown = (rebuilt / "report.md").read_text()
    assert f"**Question:** {QUESTION}" in markdown and "paper: Doe 2024, fig. 1" in markdown
    assert (rebuilt / "headline.png").read_bytes()[:4] == b"\x89PNG"


def test_without_a_report_table_the_question_is_read_from_the_selection(tmp_path):
    out = write_report(sweep_store(tmp_path / "s.sqlite").path, tmp_path / "out")
    markdown = (out / "report.md").read_text()
    assert (
        "**Question:** Does test_acc differ between dual and standard, each mechanism at its "
        "best training.lr (chosen on val_acc), per task, size and other axes?"
    ) in markdown
    assert (out / "headline.png").is_file()


@pytest.mark.parametrize(
    ("csv", "match"),
    [
        ("task,model,acc\nsame_pair,m,0.5\n", r"ref\.csv has no column n_train .*task, model, acc"),
        ("task,model,n_train,mean\nsame_pair,m,1,0.5\n", r"no column acc"),
        ("model,n_train,acc\n", r"ref\.csv has the columns model, n_train, acc; valid: a CSV"),
        (None, r"ref\.csv: cannot read it"),
    ],
)
def test_a_reference_file_without_what_the_figure_needs_is_refused_naming_it(tmp_path, csv, match):
    grid = tmp_path / "grid.toml"
    grid.write_text("")
    if csv is not None:
        (tmp_path / "ref.csv").write_text(csv)
    curve = ReferenceCurve(file="ref.csv", label="paper", source="Doe 2024", column="acc")
    store = sweep_store(tmp_path / "s.sqlite").path
    with pytest.raises(ValueError, match=match):
        write_report(store, tmp_path / "out", grid=grid, report=ReportSettings(
            reference_curves=[curve]))  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_pair_with_a_cell_still_running_gets_no_verdict(tmp_path):
    """dual at n_train 400 has a cell running at lr 3e-3: its best setting may still change,
    so that comparison says it is incomplete and is no test of the Holm family."""
    running = {("dual", 400, 3e-3, 0)}
    out = write_report(sweep_store(tmp_path / "s.sqlite", running).path, tmp_path / "out")
    pairs = pd.read_csv(out / "paired.csv").set_index("others")
    incomplete = pairs.loc["task_kwargs.n_train=400"]
    assert incomplete.verdict == "incomplete (dual: 1 cells running or not run): no verdict yet"
    assert pd.isna(incomplete.p) and pd.isna(incomplete.p_holm)
    for others in ("task_kwargs.n_train=100", "task_kwargs.n_train=200"):
        assert pairs.loc[others].verdict == "dual ahead"
        assert pairs.loc[others].p_holm == pytest.approx(2 * pairs.loc[others].p)  # 2 tests
    assert "no verdict yet" in (out / "report.md").read_text()


def test_a_grid_s_report_table_is_checked_and_the_paper_curve_is_wired(tmp_path):
    path = tiny_grid(tmp_path)
    path.write_text(path.read_text() + '[report]\nquestion = ""\n')
    with pytest.raises(ValueError, match="question"):
        load_grid(path)
    spec = load_grid("ablations/grids/relations_game_between.toml", check_device=False)
    [curve] = spec.file.report.reference_curves
    rows = reference_rows(read_reference(curve, spec.path), "task_kwargs.n_train", "test_id_acc")
    between = rows[rows.task == "between"]
    assert between.n_train.min() == 250 and between.n_train.max() == 2500
    assert between.value.between(0.5, 1).all() and between.model.nunique() == 4
