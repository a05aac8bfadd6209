"""What a report was built from (provenance.json and the page's header): the source, the
grid file and its SHA-256, its overrides, the grids' axes, the environments the cells ran in,
the code and the data files' versions they ran with, the date, the reruns of reproduce.csv
kept; and the done cells stored with non-finite metrics."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ablations.report.headline import RecordedReport
from ablations.report.pages import generated_now
from ablations.results.axes import CellSource, GridAxes
from ablations.results.cells_file import lacks_environment
from ablations.results.store import FINISHED
from ablations.run.provenance import file_sha256, short_record
from ablations.run.reproduce import COLUMNS


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


def data_versions(rows: list[dict]) -> dict[tuple[str, str], dict[str, list[str]]]:
    """Per (task, data file) the finished cells of `rows` read (their environment's "data":
    {path: SHA-256}, ablations.run.provenance.data_record), the keys of the cells that read
    each digest of it; a cell that recorded no data (a store written before it was) is not
    counted, nor is a file a cell did not record (e.g. a teacher folder that gained a file)."""
    versions: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(dict)
    for row in rows:
        data = (row["environment"] or {}).get("data") if row["status"] in FINISHED else None
        if isinstance(data, dict):
            for path, digest in data.items():
                readers = versions[(row["config"]["task"], path)]
                readers.setdefault(str(digest), []).append(row["key"])
    return versions


def mixed_data(rows: list[dict], named: int = 5) -> list[str]:
    """One text per data file that the finished cells of one task of `rows` read in more than
    one version (`data_versions`: a data file or teacher edited while a grid ran, or runs at
    once with other data), most read first: "task copy, /data/boards.npz: 2 at 1a2b3c4d5e6f
    (k1, k2), 1 at 9f8e7d6c5b4a (k3)" (cells per digest), naming up to `named` cells of each
    version (0: none); [] when there is none."""
    mixed = []
    for (task, path), readers in data_versions(rows).items():
        if len(readers) < 2:
            continue
        counts = []
        for digest, keys in sorted(readers.items(), key=lambda item: -len(item[1])):
            more = ", ..." if len(keys) > named else ""
            cells = f" ({', '.join(keys[:named])}{more})" if named else ""
            counts.append(f"{len(keys)} at {digest[:12]}{cells}")
        mixed.append(f"task {task}, {path}: {', '.join(counts)}")
    return mixed


def unclean_data(rows: list[dict]) -> str | None:
    """Why the finished cells of `rows` do not rest on one version of each data file of their
    task (`mixed_data`, naming the cells); None when they do."""
    mixed = mixed_data(rows)
    if not mixed:
        return None
    return f"cells of one task read other versions of a data file ({'; '.join(mixed)})"


def data_line(rows: list[dict]) -> str | None:
    """The header's line on the data files that the finished cells of one task of `rows` read
    in more than one version, with how many cells read each (`mixed_data`); None when none."""
    mixed = mixed_data(rows, named=0)
    if not mixed:
        return None
    return (
        "Data: cells of one task trained on other versions of a data file, so they are not "
        "the same experiment (`attn-zoo report --require-clean` refuses them): " + "; ".join(mixed)
    )


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
NUMBERS = ("seed", "committed", "rerun", "difference", "committed_threads", "threads")  # its
# columns of numbers: one row is one row whether "2250" or "2250.0" writes a value of it


def carried_reruns(store: CellSource, folder: Path) -> pd.DataFrame | None:
    """The reproduce.csv rows a rebuilt report keeps: every row of the one in the report folder
    it replaces (the rows it was built with, and those `attn-zoo reproduce` added there), then
    every row of the one beside the cells.csv it is built from that the folder's lacks (reruns
    added there since: a row of both is kept once, `NUMBERS` compared as numbers), every row as
    its file writes it (texts); None without either file. Rows of one cell and thread count
    that differ between the two files (reruns at other commits or on other machines) are all
    kept: which is newer, neither file says. ValueError naming a file of that name that is not
    a reproduce.csv."""
    places = [folder / RERUNS]
    if store.path.suffix == ".csv":
        places.append(store.path.with_name(RERUNS))
    frames = [_reruns(path) for path in places if path.is_file()]
    if not frames:
        return None
    rows = pd.concat(frames, ignore_index=True)
    numbers = {column: pd.to_numeric(rows[column], errors="coerce") for column in NUMBERS}
    values = rows.assign(**{column: n.fillna(rows[column]) for column, n in numbers.items()})
    repeated = values.duplicated() & (rows.index >= len(frames[0]))  # the first file whole
    return rows[~repeated].reset_index(drop=True)


def _reruns(path: Path) -> pd.DataFrame:
    """The rows of the reproduce.csv at `path`, every value a text as written; ValueError
    where its columns are not a reproduce.csv's (ablations.run.reproduce.COLUMNS)."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    if list(frame.columns) != list(COLUMNS):
        raise ValueError(
            f"{path} is not a reproduce.csv (columns {', '.join(frame.columns)}; one has "
            f"{', '.join(COLUMNS)}): a report keeps the reruns there, so move that file away"
        )
    return frame


def reruns_fact(frame: pd.DataFrame) -> str:
    """One line of the report's provenance saying what the rows of reproduce.csv
    (`carried_reruns`) found."""
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
