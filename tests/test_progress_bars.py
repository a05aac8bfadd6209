"""The progress bars of ``attn-zoo bench`` and ``attn-zoo report`` (ablations.steps): on a
terminal, the steps done of those expected and the time left; off one, nothing printed and the
output as before."""

import io
import re

import pytest

pytest.importorskip("rich")
from rich.console import Console

from ablations import steps as steps_module
from ablations.bench.suites import BenchRun, bench_softmax, run_bench
from ablations.cli import main
from ablations.report.build import write_report
from ablations.results.store import ResultsStore
from ablations.steps import Steps, make_steps

DURATION = r"\d+(m\d\d)?s"


def terminal() -> tuple[Console, io.StringIO]:
    """A console that draws as on a terminal, into a string."""
    text = io.StringIO()
    return Console(force_terminal=True, file=text, width=160), text


def shown(text: io.StringIO) -> str:
    """What was drawn, without the terminal's control sequences (colours, cursor)."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text.getvalue())


def test_time_left_is_the_mean_time_per_step_times_the_steps_to_come(monkeypatch):
    clock = iter([0.0, 10.0, 25.0])  # read at the start and by each time shown
    monkeypatch.setattr(steps_module, "monotonic", lambda: next(clock))
    steps = Steps("plots")  # started at 0 s
    steps.expect(6)
    assert steps.status() == "0/6 plots · ETA -"  # no step done yet
    steps.advance(2)
    steps.doing("plot b")
    assert steps.status() == "2/6 plots · ETA 20s · plot b"  # 10 s for 2: 5 s for each of 4
    steps.advance(4)
    assert steps.status() == "6/6 plots · in 25s"


def test_bench_draws_a_bar_of_its_measurements_with_the_time_left():
    console, drawn = terminal()
    printed = []
    bench = BenchRun(suite=["softmax"], lengths=[8, 16], repeats=1, backends=["naive", "flex"],
                     no_memory=True, heads=2, head_dim=8)  # fmt: skip
    tables = run_bench(bench, out=printed.append, console=console)
    text = shown(drawn)
    # 2 backends x 2 lengths x (forward, fwd+bwd), flex's refused calls counted as done
    assert {int(done) for done in re.findall(r"(\d+)/8 measurements", text)} == {0, 2, 4, 6, 8}
    assert re.search(rf"softmax .* [246]/8 measurements · ETA {DURATION} · N=", text)
    assert re.search(rf"8/8 measurements · in {DURATION}\s*$", text)
    assert "measurements" not in "".join(printed)  # the bar is not in the printed lines
    assert set(tables["softmax"].backend) == {"naive", "flex"}


def test_memory_measurements_are_counted_too():
    steps = Steps()
    bench_softmax(lengths=[8, 16], backends=["flex"], repeats=1, heads=2, head_dim=8,
                  progress=steps)  # fmt: skip
    assert steps.done == steps.total == 1 * 2 * 3  # forward, fwd+bwd, memory: all refused


def test_bench_off_a_terminal_prints_only_its_lines(capsys):
    assert type(make_steps("softmax", "measurements")) is Steps  # stderr captured: no TTY
    argv = ["bench", "--suite", "softmax", "--lengths", "8", "--repeats", "1", "--no-memory"]
    argv += ["--backends", "naive", "sdpa", "--heads", "2", "--head-dim", "8"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("machine: ") and lines[1] == ""
    assert lines[2].startswith("softmax attention kernel: ") and lines[3].startswith("backend")
    assert [line.split()[0] for line in lines[4:]] == ["naive", "sdpa"]  # the table, no more


@pytest.fixture
def store(tmp_path):
    """Three done cells of one task: two plots planned (learning curves, accuracy vs
    parameters: not drawn, every cell has the same parameter count)."""
    store = ResultsStore(tmp_path / "small.sqlite")
    for seed in range(3):
        config = {
            "grid": "small", "task": "same_pair", "task_name": "same_pair",
            "task_kwargs": {"n_train": 100}, "size": {"label": "xs", "d_model": 16},
            "mechanism": "softmax", "mechanism_name": "softmax", "mechanism_kwargs": {},
            "training": {"steps": 20, "batch_size": 8}, "seed": seed,
        }  # fmt: skip
        metrics = {"steps": 20, "params": 100, "step_ms": 1.0, "test_acc": 0.5 + seed / 10}
        store.finish(store.claim(config), "done", metrics, [[10, 1.0, 1.0, 0.4]])
    store.close()
    return store.path


def test_report_draws_a_bar_of_its_steps_with_the_time_left(store, tmp_path):
    console, drawn = terminal()
    with make_steps("report", "steps", console) as progress:
        out = write_report(store, tmp_path / "report", progress=progress)
    total = 1 + 2 + 1  # the tables, each plot planned, the pages
    assert progress.done == progress.total == total
    assert [p.name[:7] for p in out.glob("*.png")] == ["curves_"]  # one parameter count: the
    # accuracy-vs-parameters plot draws nothing (its step still counts)
    text = shown(drawn)
    assert {int(done) for done in re.findall(rf"(\d+)/{total} steps", text)} == {0, 1, 2, 3, 4}
    assert re.search(rf"report .* [123]/{total} steps · ETA {DURATION} · plot curves_", text)
    assert re.search(rf"{total}/{total} steps · in {DURATION}\s*$", text)


def test_report_off_a_terminal_prints_only_its_line(store, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(store), "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    assert err == ""
    assert (
        printed == f"wrote {out}/report.md, {out}/index.html and the CSVs and plots beside them\n"
    )
