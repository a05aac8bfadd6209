"""The results store: keys, statuses, export, and no row lost or duplicated under SIGKILL."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ablations.store import ResultsStore, config_key


def test_keys_are_canonical():
    assert config_key({"a": 1, "b": [1, 2]}) == config_key({"b": [1, 2], "a": 1})
    assert config_key({"a": 1}) != config_key({"a": 2})


def test_lifecycle_and_dataframe(tmp_path):
    store = ResultsStore(tmp_path / "grid" / "results.sqlite")
    done = {"task": "same_pair", "seed": 0}
    failed = {"task": "same_pair", "seed": 1}
    key = store.start(done)
    assert store.status(done) == "running" and store.finished_keys() == set()
    store.finish(
        key, "done", metrics={"acc": 0.9}, curve=[[10, 0.5], [20, 0.9]], environment={"torch": "x"}
    )
    store.finish(store.start(failed), "failed", error="Traceback ...")
    assert store.status(done) == "done" and store.status({"seed": 9}) is None
    assert store.finished_keys() == {config_key(done), config_key(failed)}
    frame = store.to_dataframe()
    assert list(frame.status) == ["done", "failed"]
    assert frame.loc[0, "metrics.acc"] == 0.9 and frame.loc[0, "curve"] == [[10, 0.5], [20, 0.9]]
    assert frame.loc[1, "error"] == "Traceback ..." and frame.loc[1, "config.seed"] == 1
    with pytest.raises(ValueError, match="status='running'"):
        store.finish(key, "running")
    with pytest.raises(KeyError, match="call start"):
        store.finish("nope", "done")


def test_restart_replaces_an_unfinished_row(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    config = {"seed": 3}
    store.start(config)
    store.finish(store.start(config), "diverged", metrics={"step": 7})
    frame = store.to_dataframe()
    assert len(frame) == 1 and frame.loc[0, "status"] == "diverged"


WRITER = textwrap.dedent(
    """
    import sys, time
    from ablations.store import ResultsStore
    store = ResultsStore(sys.argv[1])
    for seed in range(1_000):
        config = {"seed": seed}
        if store.status(config) in ("done", "failed", "diverged"):
            continue
        key = store.start(config)
        print(seed, flush=True)
        store.finish(key, "done", metrics={"seed": seed})
    """
)


def test_sigkill_midway_then_resume_loses_and_duplicates_nothing(tmp_path):
    path = tmp_path / "r.sqlite"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    for _ in range(50):  # let it record some cells, then kill it without warning
        writer.stdout.readline()
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    store = ResultsStore(path)
    before = store.to_dataframe()
    done_before = set(before[before.status == "done"]["config.seed"])
    assert len(done_before) >= 49 and before.key.is_unique
    resumed = subprocess.run(
        [sys.executable, "-c", WRITER, str(path)], capture_output=True, text=True, check=True
    )
    rerun = {int(line) for line in resumed.stdout.split()}
    assert rerun.isdisjoint(done_before)  # finished cells are skipped
    after = store.to_dataframe()
    assert after.key.is_unique and len(after) == 1_000 and set(after.status) == {"done"}
    assert (after["metrics.seed"] == after["config.seed"]).all()
