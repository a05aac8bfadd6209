"""Reports under the seventh hostile pass (issue 38, no silent wrong answer), each as it failed:
a report rebuilt from another report's cells.csv kept that report's reproduce.csv and dropped
the reruns made in its own folder (D10); --require-clean passed, and the header said nothing,
for cells of one task trained on two versions of their data file (D11). Real stores, report
folders and files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_report_safety import config, files_under

from ablations.report.build import write_report
from ablations.report.provenance import unclean_data
from ablations.results.store import ResultsStore
from ablations.run.reproduce import COLUMNS

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # one clean commit for every cell
BOARDS = "/data/boards.npz"


def store_of(folder: Path, digests: list[str], tasks: list[str] | None = None) -> Path:
    """A store of one done cell per digest (seeds 0, 1, ...; of the task `tasks` names, default
    same_pair), all from one clean commit, cell i having read BOARDS at `digests[i]`."""
    path = folder / "cells.sqlite"
    with ResultsStore(path) as store:
        for seed, digest in enumerate(digests):
            key = store.claim(config(task=(tasks or ["same_pair"] * len(digests))[seed], seed=seed))
            environment = {"commit": COMMIT, "threads": 1, "data": {BOARDS: digest}}
            metrics = {"steps": 40, "params": 1000, "test_acc": 0.5 + 0.1 * seed}
            store.finish(key, "done", metrics, [[10, 1.0, 1.0, 0.5]], environment)
    return path


def keys_of(store: Path) -> list[str]:
    """The keys of the store's cells, by seed."""
    with ResultsStore(store, readonly=True) as opened:
        rows = sorted(opened.rows(), key=lambda row: row["config"]["seed"])
    return [row["key"] for row in rows]


# D11: data files read in two versions ----------------------------------------------------


def test_cells_of_one_task_on_two_versions_of_a_data_file_are_named_and_refused(tmp_path):
    """Seeds 0 and 1 read boards.npz at one digest, seed 2 at another (the file edited while
    the grid ran), all from one clean commit: --require-clean refuses naming the cells of each
    version, before writing anything, from the store and from the report's cells.csv; without
    it the header says how many cells read which version."""
    store = store_of(tmp_path, ["a" * 64, "a" * 64, "b" * 64])
    first, second, third = keys_of(store)
    named = (
        f"--require-clean: cells of one task read other versions of a data file (task "
        f"same_pair, {BOARDS}: 2 at aaaaaaaaaaaa ({first}, {second}), 1 at bbbbbbbbbbbb "
        f"({third}))"
    )
    with pytest.raises(ValueError) as refused:
        write_report(store, tmp_path / "clean", require_clean=True)
    assert str(refused.value) == named
    assert not (tmp_path / "clean").exists()

    report = write_report(store, tmp_path / "report")
    text = (report / "report.md").read_text()
    assert "Code: every cell from one clean commit, 0123456789ab" in text
    header = next(line for line in text.splitlines() if line.startswith("- Data: "))
    assert "not the same experiment" in header and "--require-clean" in header
    assert header.endswith(f"{BOARDS}: 2 at aaaaaaaaaaaa, 1 at bbbbbbbbbbbb"), header
    with pytest.raises(ValueError, match="read other versions of a data file"):
        write_report(report / "cells.csv", tmp_path / "rebuilt", require_clean=True)
    assert not (tmp_path / "rebuilt").exists()


def test_one_version_per_task_is_clean(tmp_path):
    """One digest for every cell of a task is clean, and so are two tasks each on its own
    version of a file (their cells are compared within a task)."""
    for name, digests, tasks in (
        ("one", ["a" * 64] * 3, None),
        ("two_tasks", ["a" * 64, "b" * 64], ["same_pair", "other"]),
    ):
        (tmp_path / name).mkdir()
        with ResultsStore(store_of(tmp_path / name, digests, tasks), readonly=True) as store:
            assert unclean_data(list(store.rows())) is None


# D10: a rebuild keeps every rerun ----------------------------------------------------------


def reruns(keys: list[str], threads: int, commit: str) -> pd.DataFrame:
    """reproduce.csv rows (ablations/run/reproduce.py's COLUMNS) of `keys` rerun with
    `threads` threads at `commit`, one metric each."""
    rows = [
        dict(key=key, task="same_pair", size="xs", mechanism="standard", seed=seed,
             metric="test_acc", committed=0.5, rerun=0.5, difference=0.0,
             committed_commit=COMMIT, rerun_commit=commit, committed_device="cpu",
             rerun_device="cpu", committed_threads=1, threads=threads, note="")
        for seed, key in enumerate(keys)
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLUMNS))


def add_reruns(path: Path, frame: pd.DataFrame) -> None:
    """`frame`'s rows added to the reproduce.csv at `path` (created where missing), the file
    written as `attn-zoo reproduce` writes it."""
    if path.is_file():
        frame = pd.concat([pd.read_csv(path, dtype={"key": str}, keep_default_na=False), frame])
    frame.to_csv(path, index=False, float_format="%.10g")


def test_a_rebuilt_report_keeps_the_reruns_of_its_folder_and_of_its_source(tmp_path):
    """Report B built from report A's cells.csv (A has a reproduce.csv), then B's cells rerun
    with 4 threads into B (as `attn-zoo reproduce B --threads 4` does) and A's with 2 into A:
    B rebuilt from A's cells.csv keeps every row of both files, each once (A's rows copied into
    B and written back with "0.5" as "0.5" or "1" as "1.0" are one row), and its header
    counts them."""
    store = store_of(tmp_path, ["a" * 64] * 3)
    keys = keys_of(store)
    a = write_report(store, tmp_path / "A")
    add_reruns(a / "reproduce.csv", reruns(keys[:2], 1, "aaaa"))
    b = write_report(a / "cells.csv", tmp_path / "B")
    mine = pd.read_csv(b / "reproduce.csv", dtype={"key": str}, keep_default_na=False)
    pd.concat([mine, reruns(keys, 4, "bbbb")]).to_csv(b / "reproduce.csv", index=False)
    add_reruns(a / "reproduce.csv", reruns(keys[2:], 2, "cccc"))

    write_report(a / "cells.csv", b, note="rebuilt")
    kept = pd.read_csv(b / "reproduce.csv", dtype={"key": str}, keep_default_na=False)
    runs = sorted(zip(kept.key, kept.threads, kept.rerun_commit, strict=True))
    assert runs == sorted(
        [(key, 1, "aaaa") for key in keys[:2]]
        + [(key, 4, "bbbb") for key in keys]
        + [(keys[2], 2, "cccc")]
    )
    facts = (b / "report.md").read_text()
    assert "Reproduced (reproduce.csv): 3 of the report's cells rerun at aaaa, bbbb, cccc" in facts


def test_a_reproduce_csv_that_is_not_one_is_refused_before_anything_is_written(tmp_path):
    """A file named reproduce.csv in the report folder that is no `attn-zoo reproduce` output:
    refused naming it, the folder as it was."""
    report = write_report(store_of(tmp_path, ["a" * 64]), tmp_path / "report")
    (report / "reproduce.csv").write_text("a,b\n1,2\n")
    before = files_under(report)
    with pytest.raises(ValueError, match=f"{report / 'reproduce.csv'} is not a reproduce.csv"):
        write_report(report / "cells.csv", report)
    assert files_under(report) == before
