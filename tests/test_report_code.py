"""A report says which code its cells ran from (each cell's recorded commit and, for a dirty
tree, the digest of its changes: ablations.run.provenance.source_state), and `--require-clean`
refuses cells that did not all run from one clean commit, naming them."""

import json

import pandas as pd
import pytest
from grids import STD, tiny_grid

from ablations.cli import main
from ablations.grid.spec import load_grid
from ablations.report.build import write_report
from ablations.results.store import ResultsStore
from ablations.run.provenance import source_state
from ablations.run.runner import run_grid

CLEAN, OTHER = "a" * 40, "b" * 40


def store_of(tmp_path, commits: list[dict]) -> ResultsStore:
    """A store whose cells (one per environment of `commits`) are done."""
    spec = load_grid(tiny_grid(tmp_path, seeds=list(range(len(commits))), mechanisms=[STD]))
    store = ResultsStore(spec.store)
    for cell, env in zip(spec.cells, commits, strict=True):
        store.finish(store.claim(cell.config()), "done", {"test_acc": 0.5}, [], env)
    return store


def test_the_header_counts_the_cells_of_each_commit(tmp_path):
    dirty = {"commit": f"{OTHER}-dirty", "diff_sha256": "c" * 64}
    store = store_of(tmp_path, [{"commit": CLEAN}, {"commit": CLEAN}, dirty, {}])
    out = write_report(store, tmp_path / "report")
    code = json.loads((out / "provenance.json").read_text())["code"]
    assert code == {"aaaaaaaaaaaa": 2, "bbbbbbbbbbbb-dirty (diff cccccccccccc)": 1,
                    "no recorded commit": 1}  # fmt: skip
    assert ("- Code: 2 cells at aaaaaaaaaaaa; 1 cells at bbbbbbbbbbbb-dirty (diff cccccccccccc); "
            "1 cells at no recorded commit") in (out / "report.md").read_text()  # fmt: skip


def test_the_page_header_names_one_clean_commit_or_why_the_cells_are_not_from_one(tmp_path):
    """Issue: a report mixing commits and dirty trees said so only in its provenance details;
    the line under the question now says it, with the grid's [report] unclean reason."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    clean = write_report(store_of(tmp_path / "a", [{"commit": CLEAN}] * 2), tmp_path / "clean")
    head = (clean / "report.md").read_text().split("## ")[0]
    assert "- Code: every cell from one clean commit, aaaaaaaaaaaa" in head
    grid = tiny_grid(tmp_path, seeds=[0, 1], mechanisms=[STD])
    grid.write_text(grid.read_text() + '[report]\nunclean = "GPU cells, not rerun on the CPU"\n')
    store = store_of(tmp_path / "b", [{"commit": CLEAN}, {"commit": f"{OTHER}-dirty"}])
    report = load_grid(grid).file.report
    mixed = write_report(store, tmp_path / "mixed", grid=grid, report=report)
    head = (mixed / "report.md").read_text().split("## ")[0]
    assert "- Code: 2 cells from 2 code versions (1 not a clean commit" in head
    assert "why: GPU cells, not rerun on the CPU. Most: 1 at aaaaaaaaaaaa" in head
    without = write_report(store, tmp_path / "without")  # no grid: no reason
    assert (
        "why: not given (the grid file sets no report.unclean)"
        in (without / "report.md").read_text()
    )


def test_cells_of_one_commit_with_other_plugin_code_are_two_versions(tmp_path):
    """The hostile pass: two runs on one store, one importing plugA.py and one plugB.py (the
    same mechanism name), reported as one mechanism of 4 seeds from one clean commit."""
    a = {"commit": CLEAN, "plugins": {"/x/plugA.py": "1" * 64}}
    b = {"commit": CLEAN, "plugins": {"/x/plugB.py": "2" * 64}}
    store = store_of(tmp_path, [a, a, b, b])
    out = write_report(store, tmp_path / "report")
    head = (out / "report.md").read_text().split("## ")[0]
    assert "4 cells from 2 code versions" in head
    with pytest.raises(SystemExit, match="plugins {plugB.py: 222222222222}"):
        main(["report", str(store.path), "--out", str(tmp_path / "r"), "--require-clean"])
    (tmp_path / "one").mkdir()
    one = store_of(tmp_path / "one", [a, a])
    clean = (write_report(one, tmp_path / "clean") / "report.md").read_text()
    assert (
        "every cell from one clean commit, aaaaaaaaaaaa + plugins {plugA.py: 111111111111}" in clean
    )


@pytest.mark.parametrize(
    ("commits", "fragment"),
    [
        ([{"commit": CLEAN}, {"commit": f"{CLEAN}-dirty", "diff_sha256": "d" * 64}],
         "aaaaaaaaaaaa-dirty (diff dddddddddddd): "),
        ([{"commit": CLEAN}, {"commit": OTHER}], "bbbbbbbbbbbb: "),
        ([{"commit": CLEAN}, {}], "no recorded commit: "),
    ],
)  # fmt: skip
def test_require_clean_refuses_mixed_or_dirty_code_naming_the_cells(tmp_path, commits, fragment):
    store = store_of(tmp_path, commits)
    odd = [row["key"] for row in store.rows()][1]
    with pytest.raises(SystemExit) as err:
        main(["report", str(store.path), "--out", str(tmp_path / "r"), "--require-clean"])
    assert "--require-clean: the cells come from " in str(err.value)
    assert f"{fragment}{odd}" in str(err.value)
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_a_run_records_its_code_and_one_clean_commit_passes(tmp_path):
    spec = load_grid(tiny_grid(tmp_path, seeds=[0], mechanisms=[STD],
                               training={"steps": 4, "eval_every": 2}))  # fmt: skip
    run_grid(spec, workers=1)
    (row,) = ResultsStore(spec.store, readonly=True).rows()
    here = source_state()
    assert {k: row["environment"].get(k) for k in here} == here
    (tmp_path / "clean").mkdir()
    clean = store_of(tmp_path / "clean", [{"commit": CLEAN}] * 2)
    main(["report", str(clean.path), "--out", str(tmp_path / "r"), "--require-clean"])
    assert (tmp_path / "r" / "report.md").is_file()


def test_timings_from_contended_workers_are_marked_and_never_bold(tmp_path):
    """ms/step measured while 4 workers of one thread shared 2 cores says so, and the lowest
    uncontended timing is the one in bold."""
    spec = load_grid(tiny_grid(tmp_path, seeds=[0]))  # std and rel
    store = ResultsStore(spec.store)
    busy = {"workers": 4, "threads": 1, "cpus": 2}
    for cell, (ms, env) in zip(spec.cells, [(5.0, busy), (9.0, {**busy, "workers": 2})],
                               strict=True):  # fmt: skip
        metrics = {"test_acc": 0.5, "step_ms": ms, "params": 100}
        store.finish(store.claim(cell.config()), "done", metrics, [], env)
    out = write_report(store, tmp_path / "report")
    summary = pd.read_csv(out / "summary.csv").set_index("mechanism")
    assert summary.contended.to_dict() == {"std": True, "rel": False}
    text = (out / "report.md").read_text()
    assert "| 5.0 (contended) |" in text and "| **9.0** |" in text


def test_a_local_run_records_its_workers_and_cpus(tmp_path):
    spec = load_grid(tiny_grid(tmp_path, seeds=[0], mechanisms=[STD],
                               training={"steps": 4, "eval_every": 2}))  # fmt: skip
    run_grid(spec, workers=1)
    (row,) = ResultsStore(spec.store, readonly=True).rows()
    assert row["environment"]["workers"] == 1 and row["environment"]["cpus"] >= 1
