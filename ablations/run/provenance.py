"""What a cell's result depends on beyond its key: the source tree it ran from, the data files
its task read and the plugin files its run imported, each recorded in the cell's environment,
and a run refused before training when finished cells of its grid were made from other ones.

    environment["commit"]   the git commit of the source tree ("-dirty" appended where it has
                            uncommitted changes; "unknown" outside a git checkout), and
    environment["diff_sha256"]  for a dirty tree, the SHA-256 of its changes (`source_state`):
                            two cells of one dirty commit ran the same code only if it is equal

    environment["data"]     {path: sha256} of each file the task read (`Task.data_files`)
                            and of each file of the cell's teacher folder, if any
                            (ablations.grid.teacher), recorded by the worker that trained
                            the cell
    environment["plugins"]  {name: sha256} of each plugin the grid's run imported
                            (`GridSpec.imports`: a file's path, a module's name) and of each
                            installed package registering one through an entry point
                            ("my_package (entry point)"), over every file of its code
                            (`plugin_record`: its own, its package's modules, the helper
                            modules it imported), recorded by the driver ({} for none), which
                            hands it and its commit to the workers for their
                            resume checkpoints (ablations.run.resume.ResumePlan.sources)

A cell's key holds a data file as the grid names it ("boards.npz") and a mechanism by its
registered name ("standard"); a changed file, or a plugin that re-registers a built-in name,
would put other results under the same key. So `mixed_provenance` compares the finished (done
or diverged) cells of the grid in its store with this run: the digests of their data files in
order, and the digests of their plugins as a set (a plugin may move; paths do not count), and
says in one line which cell differs; a cell recorded without them (a store written before they
were recorded) is not compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Sequence
from contextlib import suppress
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

from ablations.files import file_state
from ablations.grid.cell import Cell
from ablations.grid.plugins import plugin_files
from ablations.grid.teacher import teacher_files
from ablations.results.store import ResultsStore
from attn_zoo.registry import PLUGIN_GROUP

COMPARED = ("done", "diverged")  # the finished cells a run skips and a report uses


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of the file at `path` (hex), read once per state of the file: `file_state`."""
    return _sha256(os.path.realpath(path), file_state(path))


@cache
def _sha256(path: str, state: tuple[int, ...]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


CODE = ("attn_zoo", "ablations", "pyproject.toml")  # what a cell's result can depend on


def source_state(here: Path | None = None) -> dict[str, str]:
    """The code this package runs (or the checkout holding `here`), as git sees it: {"commit": the
    checkout's commit, + "-dirty" where `CODE` differs from it (tracked changes, or untracked files
    git does not ignore), "diff_sha256": the SHA-256 of those differences (`git diff HEAD --binary
    -- CODE`, then each untracked file's path and bytes), only where dirty}; {"commit": "unknown"}
    outside a git checkout. Changes elsewhere (reports, docs, tests) change no result: not
    counted."""
    here = here or Path(__file__).resolve().parent

    def git(*args: str) -> bytes | None:
        out = subprocess.run(["git", "-C", str(here), *args], capture_output=True)
        return out.stdout if out.returncode == 0 else None

    commit = (git("rev-parse", "HEAD") or b"").decode().strip()
    if not commit:
        return {"commit": "unknown"}
    root = Path((git("rev-parse", "--show-toplevel") or b"").decode().strip())
    diff = git("-C", str(root), "diff", "HEAD", "--binary", "--", *CODE) or b""
    listed = git("-C", str(root), "ls-files", "--others", "--exclude-standard", "-z", "--", *CODE)
    untracked = [name for name in (listed or b"").split(b"\0") if name]
    if not diff and not untracked:
        return {"commit": commit}
    digest = hashlib.sha256(diff)
    for name in untracked:
        digest.update(name + b"\0")
        with suppress(OSError):  # removed since git listed it
            digest.update((root / os.fsdecode(name)).read_bytes())
    return {"commit": f"{commit}-dirty", "diff_sha256": digest.hexdigest()}


def data_record(cell: Cell, task) -> dict[str, str]:
    """{path: SHA-256} of every file `cell`'s `task` reads (`Task.data_files`) and of every
    file of its teacher folder (ablations.grid.teacher.teacher_files); {} for a generated
    task without teacher."""
    files = [*task.data_files(), *teacher_files(cell.size, cell.folder)]
    return {str(path): file_sha256(path) for path in files}


def plugin_record(imports: Sequence[str]) -> dict[str, str | None]:
    """{name: SHA-256} of each plugin of `imports` (resolved names, as `GridSpec.imports`) and
    of each top-level package of an installed entry-point plugin (`entry_point_packages`, named
    "PACKAGE (entry point)": every registry loads them, imported or not), over the files of its
    code in this process (ablations.grid.plugins.plugin_files: its own, its package's modules,
    the helper modules its import brought in): the digest of its file where that is all (of a
    module without a file: None), else the SHA-256 of their sorted digests (one per line), so
    that an edit of any of them changes it."""
    record: dict[str, str | None] = {}
    named = {name: name for name in imports}
    named |= {f"{package} (entry point)": package for package in entry_point_packages()}
    for name, plugin in named.items():
        files = plugin_files(plugin)
        if len(files) <= 1:
            record[name] = file_sha256(files[0]) if files else None
            continue
        digests = sorted(file_sha256(file) for file in files)
        record[name] = hashlib.sha256("\n".join(digests).encode()).hexdigest()
    return record


def entry_point_packages() -> list[str]:
    """The top-level packages (or modules) of the installed plugins' entry points (group
    attn_zoo.registry.PLUGIN_GROUP), sorted: ``mine = "my_package.attention"`` names
    my_package, whose every module is the plugin's code."""
    return sorted({entry.module.split(".")[0] for entry in entry_points(group=PLUGIN_GROUP)})


def short_record(record: dict) -> str:
    """{name: digest} as "{mine.py: 1a2b3c4d5e6f, ...}" ("{}" for none)."""
    items = (f"{Path(k).name}: {(v or 'no file')[:12]}" for k, v in record.items())
    return "{" + ", ".join(items) + "}"


def mixed_provenance(cells: Iterable[Cell], results: ResultsStore, plugins: dict) -> str | None:
    """The line saying which finished cell of `cells` in the store `results` (the run's own
    handle: a store another run is creating this instant is one) was made from other data files
    or other plugins than `plugins` (this run's `plugin_record`) and this run's data files;
    None when none was."""
    store = results.path
    rows = {row["key"]: row for row in results.rows()}
    data: dict[tuple, dict] = {}  # (task name, kwargs, teacher, folder) -> this run's record
    for cell in cells:
        row = rows.get(cell.key)
        if row is None or row["status"] not in COMPARED:
            continue
        env = row["environment"] or {}
        what = f"cell {cell} (key {cell.key}) in {store}"
        recorded = env.get("plugins")
        if recorded is not None and sorted(map(str, recorded.values())) != sorted(
            map(str, plugins.values())
        ):
            return (
                f"{what} was trained with the plugins {short_record(recorded)}, this run imports "
                f"{short_record(plugins)}: other code under the same names would be mixed with it; "
                "run with the same plugins (imports, --import) or give this run another store"
            )
        if env.get("data"):
            task = (cell.task_name, json.dumps(cell.task_kwargs, sort_keys=True),
                    cell.size.get("teacher"), cell.folder)  # fmt: skip
            if task not in data:
                data[task] = data_record(cell, cell.build_task())
            if list(env["data"].values()) != list(data[task].values()):
                return (
                    f"{what} was trained on the data files {short_record(env['data'])}, this run "
                    f"reads {short_record(data[task])}: results of other data would be mixed under "
                    "one key; restore those files or give this run another store"
                )
    return None
