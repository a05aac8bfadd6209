"""Reports: summary numbers recomputed from the fixture's own inputs, every cell accounted
for, valid PNGs, a self-contained HTML page and stable file names (slug and hash of a label).
Safety (escaping, file names, whole writes, broken checkpoints): test_report_safety.py."""

import html
import math
import re
import statistics

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from matplotlib.image import imread

from ablations.report.build import report_page, write_report
from ablations.report.pages import (
    INSIDE_LEGEND,
    LEGEND_ROW_INCHES,
    Image,
    Paragraph,
    Table,
    label_file_name,
    legend,
    new_figure,
    plot_title,
    render_markdown,
)
from ablations.report.tables import summary_table, tidy_cells
from ablations.results.store import ResultsStore
from ablations.tasks import build_task

TASKS = {  # label: (registered task name, n_train); one task at two training-set sizes
    "same_pair": ("same_pair", 500),
    "match_pattern/n=250": ("match_pattern", 250),
    "match_pattern/n=500": ("match_pattern", 500),
}
SIZES = {"small": 64, "big": 128}
MECHANISMS = ["softmax", "relational"]
SEEDS = [0, 1, 2]
BATCH_SIZE = 32
EARLY_STOP = 0.9
STEPS = range(10, 101, 10)
ENVIRONMENT = {"torch": "9.9.9", "machine": "x86_64", "threads": 4, "python": "3.11"}
TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: out of cake\n'


def config(task: str, size: str, mechanism: str, seed: int) -> dict:
    name, n_train = TASKS[task]
    training = {"steps": 100, "batch_size": BATCH_SIZE, "early_stop_target": EARLY_STOP}
    return {
        "grid": "fixture",
        "task": task,
        "task_name": name,
        "task_kwargs": {"n_train": n_train},
        "size": {"label": size, "d_model": SIZES[size], "n_layers": 2},
        "mechanism": mechanism,
        "mechanism_name": mechanism,
        "mechanism_kwargs": {},
        "training": training,
        "seed": seed,
    }


def outcome(t: int, s: int, m: int, seed: int) -> tuple[dict, list]:
    """Made-up, varied metrics and curve: validation accuracy ramps up to `final`."""
    final = 0.7 + 0.1 * m + 0.04 * s + 0.02 * t + 0.03 * seed
    ramp = 40 + 20 * seed
    curve = [[step, 1.0 - final, 1.1 - final, final * min(1.0, step / ramp)] for step in STEPS]
    metrics = {
        "steps": 100,
        "params": 1000 * (s + 1) * (m + 2),
        "step_ms": 2.0 + m + s + 0.1 * seed,
        "test_acc": final - 0.01,
    }
    return metrics, curve


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A store of 36 done cells, one failed, one diverged and one still running; and the
    inputs of the done cells by (task, size, mechanism)."""
    store = ResultsStore(tmp_path_factory.mktemp("grid") / "fixture.sqlite")
    inputs = {}
    for t, task in enumerate(TASKS):
        for s, size in enumerate(SIZES):
            for m, mechanism in enumerate(MECHANISMS):
                for seed in SEEDS:
                    metrics, curve = outcome(t, s, m, seed)
                    key = store.claim(config(task, size, mechanism, seed))
                    store.finish(key, "done", metrics, curve, ENVIRONMENT)
                    inputs.setdefault((task, size, mechanism), []).append((metrics, curve))
    key = store.claim(config("same_pair", "small", "softmax", 3))
    store.finish(key, "failed", environment=ENVIRONMENT, error=TRACEBACK)
    key = store.claim(config("same_pair", "big", "relational", 3))
    diverged = {"steps": 30, "params": 8000, "diverged_at": 30}
    store.finish(key, "diverged", diverged, [[10, 2.0, 2.0, 0.1]], ENVIRONMENT)
    store.claim(config("match_pattern/n=250", "small", "softmax", 3))
    return store, inputs


@pytest.fixture(scope="module")
def report(grid, tmp_path_factory):
    store, _ = grid
    return write_report(store.path, tmp_path_factory.mktemp("report"), target=0.8)


def pngs_of(names: set[str], part: str) -> str:
    """The one learning-curves file among `names` whose name holds `part`."""
    (name,) = [n for n in names if n.startswith("curves_") and part in n]
    return name


def half_width(values: list[float]) -> float:
    """Half the 95% Student-t interval of the mean of `values`."""
    n = len(values)
    return scipy.stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)


def expected_row(runs: list, target: float) -> dict:
    """The summary row of one group, recomputed with plain Python."""
    accs = [metrics["test_acc"] for metrics, _ in runs]
    steps = []
    for _, curve in runs:
        reached = [step for step, _, _, val in curve if val >= target]
        if reached:
            steps.append(reached[0])
    return {
        "seeds": len(runs),
        "test_acc_mean": statistics.mean(accs),
        "test_acc_std": statistics.stdev(accs),
        "test_acc_low": statistics.mean(accs) - half_width(accs),
        "test_acc_high": statistics.mean(accs) + half_width(accs),
        "reached": len(steps),
        "steps_to_target": statistics.mean(steps) if steps else float("nan"),
        "samples_to_target": statistics.mean(s * BATCH_SIZE for s in steps) if steps else np.nan,
        "params": statistics.mean(metrics["params"] for metrics, _ in runs),
        "step_ms": statistics.mean(metrics["step_ms"] for metrics, _ in runs),
    }


def check_summary(summary: pd.DataFrame, inputs: dict, target: float) -> None:
    assert len(summary) == len(inputs)
    for _, row in summary.iterrows():
        expected = expected_row(inputs[(row.task, row["size"], row.mechanism)], target)
        assert row.target == target
        for column, value in expected.items():
            assert row[column] == pytest.approx(value, nan_ok=True), column


def test_summary_matches_the_inputs(grid):
    store, inputs = grid
    summary = summary_table(tidy_cells(store.to_dataframe()), store.curves())  # target: its
    # early_stop_target
    check_summary(summary, inputs, EARLY_STOP)
    assert 0 < summary.reached.sum() < summary.seeds.sum()  # the target is met only sometimes
    cells = summary.set_index(["task", "size", "mechanism"]).cells
    assert cells[("same_pair", "small", "softmax")] == 4  # 3 done + 1 failed
    assert cells[("match_pattern/n=250", "small", "softmax")] == 4  # 3 done + 1 running
    assert cells.sum() == 39


def test_report_files_and_numbers(grid, report):
    _, inputs = grid
    pngs = {label_file_name(kind, label) for kind in ("curves", "vs_params") for label in TASKS}
    pngs.add(label_file_name("vs_train_size", "match_pattern"))
    assert re.fullmatch(r"curves_match_pattern-n-250_[0-9a-f]{8}\.png", pngs_of(pngs, "n-250"))
    names = {p.name for p in report.iterdir()}
    tables = {"cells.csv", "curves.csv", "summary.csv", "provenance.json"}
    assert names == pngs | {"report.md", "index.html"} | tables
    check_summary(pd.read_csv(report / "summary.csv"), inputs, 0.8)
    store, _ = grid
    curves = pd.read_csv(report / "curves.csv", dtype={"key": str})
    pd.testing.assert_frame_equal(curves, store.curves(), check_dtype=False)
    assert len(curves) == 36 * len(STEPS) + 1  # the done cells' points, the diverged one's
    cells = pd.read_csv(report / "cells.csv")
    assert len(cells) == 39 and sorted(cells.status.unique()) == sorted(
        ["done", "failed", "diverged", "running"]
    )
    assert {"model.d_model", "task_kwargs.n_train", "metrics.test_acc"} <= set(cells)


def test_pngs_are_valid_and_linked(report):
    pngs = sorted(report.glob("*.png"))
    for path in pngs:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(np.unique(imread(path))) > 1, path.name
    markdown = (report / "report.md").read_text()
    assert sorted(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)) == [p.name for p in pngs]
    page = (report / "index.html").read_text()
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == len(pngs)
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http" not in page and ".png" not in page


def test_every_cell_is_accounted_for(report):
    markdown = (report / "report.md").read_text()
    assert "Cells: 39 (36 done, 1 failed, 1 diverged, 1 running)" in markdown
    assert "torch 9.9.9, machine x86_64, threads 4" in markdown and "fixture" in markdown
    section = markdown.split("## Cells not in the tables")[1]
    assert "| same_pair | small | softmax | 3 | failed | RuntimeError: out of cake |" in section
    assert "| same_pair | big | relational | 3 | diverged | loss diverged at step 30 |" in section
    assert "| match_pattern/n=250 | small | softmax | 3 | running | unfinished" in section


def test_the_environment_line_names_the_gpu_a_cell_trained_on(tmp_path):
    """The Fastformer Shakespeare cells ran on two GPUs (an H200, then an H100); the header
    named neither. A CPU cell's device name is no GPU."""
    store = ResultsStore(tmp_path / "gpus.sqlite")
    devices = [("cpu", "cpu"), ("cuda:0", "NVIDIA H200"), ("cuda:0", "NVIDIA H100 80GB HBM3")]
    for seed, (device, name) in enumerate(devices):
        environment = {**ENVIRONMENT, "device": device, "device_name": name}
        key = store.claim(config("same_pair", "small", "softmax", seed))
        store.finish(key, "done", *outcome(0, 0, 0, seed), environment)
    markdown = (write_report(store, tmp_path / "out") / "report.md").read_text()
    (line,) = [line for line in markdown.splitlines() if line.startswith("- Environment:")]
    assert line.removeprefix("- Environment: ").split("; ") == [
        "torch 9.9.9, machine x86_64, threads 4",
        "torch 9.9.9, machine x86_64, gpu NVIDIA H200, threads 4",
        "torch 9.9.9, machine x86_64, gpu NVIDIA H100 80GB HBM3, threads 4",
    ]


def not_finished(store: ResultsStore) -> set[tuple[str, str, str]]:
    """The (task, size, mechanism) rows of the fixture with a cell not done (failed, diverged,
    running): no best of theirs is bold (a mean over the seeds that survived is no best)."""
    return {
        (row["config"]["task"], row["config"]["size"]["label"], row["config"]["mechanism"])
        for row in store.rows()
        if row["status"] != "done"
    }


def test_best_values_are_bold(grid, report):
    store, inputs = grid
    markdown = (report / "report.md").read_text()
    table = markdown.split("## Task: same_pair")[1].split("##")[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")][1:]
    accs = {
        (size, mechanism): statistics.mean(metrics["test_acc"] for metrics, _ in runs)
        for (task, size, mechanism), runs in inputs.items()
        if task == "same_pair" and (task, size, mechanism) not in not_finished(store)
    }
    best = max(accs, key=accs.get)
    for row in rows:
        size, mechanism, acc = row[0].strip("| "), row[1], row[3]
        assert acc.startswith("**") == ((size, mechanism) == best), row


@pytest.fixture(scope="module")
def page(grid, tmp_path_factory):
    store, _ = grid
    return report_page(store, tmp_path_factory.mktemp("page"), target=0.8)


def test_the_page_model_holds_each_table_once_with_its_best_cells_marked(grid, page):
    store, inputs = grid
    headings = [section.heading for section in page.sections]
    assert headings == [f"Task: {task}" for task in TASKS] + [
        "Training-set size: match_pattern",
        "Provenance and how to read the tables",
        "Cells not in the tables",
    ]
    for task in TASKS:
        (section,) = [s for s in page.sections if s.heading == f"Task: {task}"]
        table, *images = section.parts
        assert [type(image) for image in images] == [Image, Image]
        dashes = table.data.map(lambda text: text.startswith("-")).any(axis=1)
        assert table.header == [
            "size", "mechanism", "seeds", "test acc [95% CI]", "steps to val acc ≥ 0.8",
            "samples to target", "params", "ms/step",
        ] + ["why -"] * int(dashes.any())  # fmt: skip
        if dashes.any():  # every '-' says why
            assert list(table.data["why -"].astype(bool)) == list(dashes)
        runs = {(row[0], row[1]): inputs[(task, *row[:2])] for row in table.data.to_numpy()}
        acc = {k: statistics.mean(m["test_acc"] for m, _ in v) for k, v in runs.items()}
        params = {k: statistics.mean(m["params"] for m, _ in v) for k, v in runs.items()}
        keys = list(zip(table.data["size"], table.data["mechanism"], strict=True))
        finished = [(task, *k) not in not_finished(store) for k in keys]
        top = max(acc[k] for k, done in zip(keys, finished, strict=True) if done)
        assert list(table.bold["test acc [95% CI]"]) == [
            done and acc[k] == top for k, done in zip(keys, finished, strict=True)
        ]
        assert list(table.bold["params"]) == [params[k] == min(params.values()) for k in keys]
        assert not table.bold[["size", "mechanism", "seeds"]].to_numpy().any()
        assert [f"{p:,.0f}" for p in (params[k] for k in keys)] == list(table.data["params"])
        accs = {k: [m["test_acc"] for m, _ in runs[k]] for k in keys}
        assert list(table.data["test acc [95% CI]"]) == [
            f"{acc[k]:.3f} [{acc[k] - half_width(accs[k]):.3f}, {acc[k] + half_width(accs[k]):.3f}]"
            if len(accs[k]) > 1
            else f"{acc[k]:.3f}"
            for k in keys
        ]

    paragraph, sizes, _ = page.sections[3].parts
    assert isinstance(paragraph, Paragraph) and isinstance(sizes, Table)
    assert sizes.header == ["n_train", "size", "softmax", "relational"]
    assert sizes.data[["n_train", "size"]].to_numpy().tolist() == [
        ["250", "big"], ["250", "small"], ["500", "big"], ["500", "small"],
    ]  # fmt: skip
    assert sizes.bold["relational"].all() and not sizes.bold["softmax"].any()
    (unfinished,) = page.sections[-1].parts
    assert list(unfinished.data.status) == ["failed", "diverged", "running"]
    assert not unfinished.bold.to_numpy().any()


def test_markdown_tables_are_the_model_tables(page):
    """Every table of report.md is a table of the model, cell for cell (its markdown escapes
    undone), bold where marked."""
    blocks = re.findall(r"(?m)^(?:\|.*\|\n)+", render_markdown(page))
    tables = [part for section in page.sections for part in section.parts if type(part) is Table]
    assert len(blocks) == len(tables) == 5

    def plain(cell: str) -> str:
        return html.unescape(re.sub(r"\\(.)", r"\1", cell))

    for block, table in zip(blocks, tables, strict=True):
        first, rule, *lines = block.splitlines()
        header, *rows = [list(map(plain, line[2:-2].split(" | "))) for line in (first, *lines)]
        assert header == table.header and rule == "|" + "---|" * len(header)
        assert rows == [[f"**{t}**" if b else t for t, b in row] for row in table.rows]


def test_a_table_mask_must_match_its_data():
    data = pd.DataFrame({"a": ["1", "2"], "b": ["3", "4"]})
    assert Table(data).rows == [[("1", False), ("3", False)], [("2", False), ("4", False)]]
    assert Table(data, data == "4").rows[1] == [("2", False), ("4", True)]
    for bold in ((data == "1")[["a"]], (data == "1").rename(columns={"b": "c"})):
        with pytest.raises(ValueError, match="shape and columns"):
            Table(data, bold)
    with pytest.raises(ValueError, match="boolean"):
        Table(data, data)


def test_task_labels_and_empty_store(tmp_path):
    store = ResultsStore(tmp_path / "labels.sqlite")
    for label in ("copy_short", "copy_long"):
        cell = config("same_pair", "small", "softmax", 0) | {"task": label, "task_name": "copy"}
        store.finish(store.claim(cell), "done", *outcome(0, 0, 0, 0))
    summary = summary_table(tidy_cells(store.to_dataframe()), store.curves())
    assert list(summary.task) == ["copy_short", "copy_long"]

    out = write_report(ResultsStore(tmp_path / "empty.sqlite"), tmp_path / "empty")
    assert "Cells: 0 (0 done" in (out / "report.md").read_text() and not list(out.glob("*.png"))
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "missing.sqlite", tmp_path / "out")


def test_sequence_tasks_also_get_loss_curves(tmp_path):
    store = ResultsStore(tmp_path / "lm.sqlite")
    for seed in SEEDS:
        metrics, curve = outcome(0, 0, 0, seed)
        key = store.claim(config("match_pattern/n=250", "small", "softmax", seed))
        store.finish(key, "done", {**metrics, "test_exact": 0.5}, curve, ENVIRONMENT)
    store.close()
    out = write_report(store.path, tmp_path / "report")
    name = label_file_name("loss_curves", "match_pattern/n=250")
    assert (out / name).is_file() and f"]({name})" in (out / "report.md").read_text()
    # (a classification task gets none: test_report_files_and_numbers lists every file)


def test_a_task_that_knows_its_loss_floor_gets_it_in_the_report(tmp_path):
    """The grammar task's floor, on the very splits its cells trained and tested on."""
    store = ResultsStore(tmp_path / "lm.sqlite")
    lm = {"length": 16, "n_validation": 8, "n_test": 8}
    for seed in SEEDS[:2]:
        for n_train in (16, 32):  # the test split follows the training split in the generator
            cell = {**config("same_pair", "small", "softmax", seed), "task": "grammar"}
            cell |= {"task_name": "grammar", "task_kwargs": {**lm, "n_train": n_train}}
            metrics, _ = outcome(0, 0, 0, seed)
            task = build_task("grammar", **lm, n_train=n_train)  # as training records them
            metrics |= {"test_exact": 0.1, **task.loss_floors(task.splits(seed))}
            curve = [[step, 3.0, 2.5 + 10 / step, 0.3] for step in STEPS]  # above any floor
            store.finish(store.claim(cell), "done", metrics, curve)
        store.finish(store.claim(config("same_pair", "small", "softmax", seed)), "done",
                     *outcome(0, 0, 0, seed))  # fmt: skip
    floors = {"validation": [], "test": []}
    for seed in SEEDS[:2]:
        for n_train in (16, 32):
            task = build_task("grammar", **lm, n_train=n_train)
            for split, values in floors.items():
                values.append(float(task.best_losses(*task.splits(seed)[split][:]).mean()))
    test, validation = (statistics.mean(floors[split]) for split in ("test", "validation"))
    assert 0 < test != pytest.approx(floors["test"][0])  # the splits differ: the mean matters

    (tmp_path / "report").mkdir()
    page = report_page(store, tmp_path / "report")
    texts = {
        section.heading: " ".join(p.text for p in section.parts if isinstance(p, Paragraph))
        for section in page.sections
    }
    assert (
        f"mean loss below {test:.3f} on these test splits ({validation:.3f} on validation)"
        in (texts["Task: grammar"])
    )
    assert "floor" not in texts["Task: same_pair"]  # a task that does not know one
    images = {p.file for section in page.sections for p in section.parts if isinstance(p, Image)}
    drawn = {name for name in images if name.startswith("above_floor")}
    assert drawn == {label_file_name("above_floor", "grammar")}  # the grammar task's only
    assert (tmp_path / "report" / label_file_name("loss_curves", "grammar")) in set(
        (tmp_path / "report").glob("*.png")
    )


def test_a_cell_stored_without_its_loss_floor_gives_the_task_none(tmp_path):
    """A store written before cells recorded their floor: the report builds no task to find
    it, and says nothing of a floor rather than a wrong one."""
    store = ResultsStore(tmp_path / "lm.sqlite")
    cell = {**config("same_pair", "small", "softmax", 0), "task": "grammar"}
    cell |= {"task_name": "grammar", "task_kwargs": {"length": 16, "n_train": 16}}
    metrics, _ = outcome(0, 0, 0, 0)
    curve = [[step, 3.0, 2.5 + 10 / step, 0.3] for step in STEPS]
    store.finish(store.claim(cell), "done", {**metrics, "test_exact": 0.1}, curve)
    (tmp_path / "report").mkdir()
    page = report_page(store, tmp_path / "report")
    texts = " ".join(
        p.text for section in page.sections for p in section.parts if isinstance(p, Paragraph)
    )
    assert "floor" not in texts.lower()


@pytest.mark.parametrize(("lines", "label"), [(3, "x"), (9, "x"), (30, "x"), (12, "y" * 90)])
def test_a_legend_of_many_entries_goes_below_the_plot_which_keeps_its_size(lines, label):
    figure, ax = new_figure()
    width, height = figure.get_size_inches()
    for i in range(lines):
        ax.plot([0, 1], [0, i], label=f"{label} {i}")
    legend(figure, ax)
    figure.canvas.draw()
    inside = lines <= INSIDE_LEGEND
    assert (ax.get_legend() is not None) == inside and len(figure.legends) == (not inside)
    assert ax.get_position().height * figure.get_size_inches()[1] > 2.5  # not squeezed
    box = (ax.get_legend() or figure.legends[0]).get_window_extent()
    assert box.x0 >= 0 and box.x1 <= figure.bbox.width  # the legend fits the figure
    if not inside:
        columns = figure.legends[0]._ncols
        rows = -(-lines // columns)
        assert figure.get_size_inches()[1] == pytest.approx(height + LEGEND_ROW_INCHES * rows)
        assert (columns == 1) == (len(label) > 1)  # long labels: one column, a wider figure
        assert (figure.get_size_inches()[0] > width) == (len(label) > 1)


def test_a_long_plot_title_is_wrapped_to_fit_the_figure():
    setting = "model.attention_residual=False, model.pool=flatten, task_kwargs.n_train=16000"
    figure, ax = new_figure()
    ax.set_title(plot_title(f"match_pattern (objects=vectors); {setting}: test_acc vs n"))
    figure.canvas.draw()
    box = ax.title.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= figure.bbox.width  # unwrapped, it runs off both sides
    assert plot_title("$x$: short") == r"\$x\$: short"  # one line, dollars kept literal
