"""What a report was built from (provenance.json and the page's header): the source, the
grid file and its SHA-256, its overrides, the grids' axes, the environments the cells ran in,
the date; and the done cells stored with non-finite metrics."""

from __future__ import annotations

import io
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ablations.report.headline import RecordedReport
from ablations.report.pages import generated_now
from ablations.results.axes import CellSource, GridAxes
from ablations.results.cells_file import lacks_environment
from ablations.results.store import FINISHED
from ablations.run.provenance import file_sha256, short_record


def _environments(store: CellSource) -> list[str]:
    """The distinct (torch, machine, GPU, threads, commit) the cells ran with, as texts (the
    GPU's name where a cell trained on one); for the rows of a cells.csv without them, the
    line of the report.md beside it (`recorded_environment`), said to be theirs when other
    rows have their own."""
    seen, missing = [], 0
    for row in store.rows():
        env = dict(row["environment"] or {})
        if str(env.get("device", "cpu")).startswith("cuda") and env.get("device_name"):
            env["gpu"] = env["device_name"]
        keys = ("torch", "machine", "gpu", "threads", "commit")
        text = ", ".join(f"{k} {env[k]}" for k in keys if k in env)
        missing += lacks_environment(row)
        if text and text not in seen:
            seen.append(text)
    recorded = getattr(store, "recorded_environment", None)
    if missing and recorded:
        whose = f"for the {missing} cells without one in cells.csv: " if seen else ""
        seen.append(f"{whose}{recorded} (as the report.md beside {store.path} recorded it)")
    return seen


def code_version(row: dict) -> str | None:
    """The code a cell ran from, as its environment records it (ablations.run.provenance.
    source_state): "3a5da2dc57e9" (a clean commit), "3a5da2dc57e9-dirty (diff 9c921c857893)",
    "an unknown commit", or "no recorded commit" (a store written before commits were
    recorded), followed by the plugins it ran with where it recorded any ("3a5da2dc57e9 +
    plugins {mine.py: 1a2b3c4d5e6f}": two runs with other plugin code under one mechanism
    name are two versions); None for a cell that never ran."""
    if row["status"] not in FINISHED:
        return None
    env = row["environment"] or {}
    commit = env.get("commit")
    if commit is None:
        return "no recorded commit"
    if commit == "unknown":
        return "an unknown commit"
    name = commit.removesuffix("-dirty")[:12] + ("-dirty" if commit.endswith("-dirty") else "")
    name = f"{name} (diff {env['diff_sha256'][:12]})" if env.get("diff_sha256") else name
    plugins = env.get("plugins")  # other plugin code under one name is other code
    return (
        f"{name} + plugins {short_record(plugins)}"
        if isinstance(plugins, dict) and plugins
        else name
    )


CLEAN = re.compile(r"[0-9a-f]{12}( \+ plugins .*)?")  # a clean commit's `code_version`


def code_versions(rows: list[dict]) -> dict[str, int]:
    """How many of the finished cells of `rows` ran from each `code_version`, most first."""
    counts = Counter(filter(None, map(code_version, rows)))
    return dict(counts.most_common())


def unclean_code(rows: list[dict]) -> str | None:
    """Why the finished cells of `rows` are not all from one clean commit (a dirty tree, no
    recorded commit, or several commits), naming up to 5 cells of each version past the
    first; None when they are."""
    versions = code_versions(rows)
    dirty = [v for v in versions if not CLEAN.fullmatch(v)]
    if not dirty and len(versions) <= 1:
        return None
    named = []
    for version in [v for v in versions if v in dirty] or list(versions)[1:]:
        keys = [row["key"] for row in rows if code_version(row) == version]
        more = f", ... ({len(keys)} cells)" if len(keys) > 5 else ""
        named.append(f"{version}: {', '.join(keys[:5])}{more}")
    counts = ", ".join(f"{n} at {v}" for v, n in versions.items())
    return f"the cells come from {counts}; not one clean commit ({'; '.join(named)})"


def code_line(versions: dict[str, int], unclean: str | None) -> str:
    """The header's line on the code of the finished cells (`code_versions`): the one clean
    commit they all ran from, or how many commits and dirty trees they come from, with the
    grid's [report] `unclean` reason (or that none is given) and the most frequent version."""
    if not versions:
        return "Code: no cell ran"
    (first, n), total = next(iter(versions.items())), sum(versions.values())
    if len(versions) == 1 and CLEAN.fullmatch(first):
        return f"Code: every cell from one clean commit, {first}"
    dirty = sum(1 for v in versions if not CLEAN.fullmatch(v))
    why = unclean or "not given (the grid file sets no report.unclean)"
    return (
        f"Code: {total} cells from {len(versions)} code versions ({dirty} not a clean commit: "
        f"a dirty tree or no recorded commit), so not from one clean commit (`attn-zoo report "
        f"--require-clean` refuses them); why: {why}. Most: {n} at {first}; every version under "
        "Provenance below"
    )


def non_finite_metrics(store: CellSource) -> dict[str, str]:
    """Per key of a done cell with NaN or infinite metrics (a store written before training
    recorded such a cell as diverged), those metrics' names: 'val_loss, test_loss'."""
    found = {}
    for row in store.rows():
        metrics = row["metrics"] or {}
        names = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
        if row["status"] == "done" and names:
            found[row["key"]] = ", ".join(names)
    return found


def provenance_record(
    store: CellSource,
    curves: pd.DataFrame | None,
    grid: str | Path | None,
    overrides: Sequence[str],
    axes: dict[str, GridAxes],
    code: dict[str, int],
    recorded: RecordedReport | None = None,
) -> dict:
    """What the report was built from, as provenance.json holds it: `source` (the store's or
    cells.csv's path), `curves` (whether it had learning curves), `attention_carried` (whether a
    cells.csv's report beside it gave it at least one attention map), `grid_file` and `grid_sha256`
    (the grid file's SHA-256; None without a grid), `overrides` (its --set values), `axes` (the
    report's grids' swept keys and selection, as their runs recorded them: results/axes.py, read
    back by a report rebuilt from its cells.csv), `report` (the grid's [report] with its reference
    curves' rows, `recorded`: ablations/report/headline.py; None without), `environment`
    (`_environments`) and `generated` (the date)."""
    digest = None if grid is None else file_sha256(grid)
    return {
        "source": str(store.path),
        "curves": curves is not None,
        "attention_carried": not store.draws_maps and bool(store.attention and store.attention[1]),
        "grid_file": None if grid is None else str(grid),
        "grid_sha256": digest,
        "overrides": list(overrides),
        "axes": {name: grid_axes.to_json() for name, grid_axes in axes.items()},
        "report": None if recorded is None else recorded.model_dump(mode="json"),
        "code": code,
        "environment": _environments(store),
        "generated": generated_now(),
    }


RERUNS = "reproduce.csv"  # `attn-zoo reproduce`'s comparison (ablations/run/reproduce.py)


def carried_reruns(store: CellSource, folder: Path) -> bytes | None:
    """The reproduce.csv a rebuilt report keeps: the one beside the cells.csv it is built from,
    else the one in the report folder it replaces (None without either)."""
    places = [store.path.with_name(RERUNS)] if store.path.suffix == ".csv" else []
    for path in [*places, folder / RERUNS]:
        if path.is_file():
            return path.read_bytes()
    return None


def reruns_fact(reruns: bytes) -> str:
    """One line of the report's provenance saying what reproduce.csv found."""
    frame = pd.read_csv(io.BytesIO(reruns), dtype={"key": str}, keep_default_na=False)
    compared = frame[frame.metric != ""]
    differences = pd.to_numeric(compared.difference, errors="coerce")
    commits = ", ".join(sorted(set(frame.rerun_commit)))
    line = (
        f"Reproduced ({RERUNS}): {frame.key.nunique()} of the report's cells rerun at {commits}; "
        f"{int((differences == 0).sum())} of {len(compared)} metric values identical"
    )
    if differences.abs().gt(0).any():
        largest = compared.loc[differences.abs().idxmax()]
        line += (
            f", largest difference {float(largest.difference):+.4g} ({largest.metric}, "
            f"{largest.mechanism}, seed {largest.seed}, {largest.threads} threads)"
        )
    noted = frame[frame.note != ""]  # not rerun, not finished, a metric one side lacks,
    if len(noted):  # other plugin code
        line += f"; rows with a note: {len(noted)} ({'; '.join(sorted(set(noted.note)))})"
    return line
