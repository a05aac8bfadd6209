"""A report's folder, written whole or not at all: the report is written into a hidden sibling
folder that then replaces the old one in one step (Linux renameat2 RENAME_EXCHANGE; elsewhere
two renames, repaired by the next report), and what killed reports left is cleaned up.

Only a folder that is missing, empty or a previous report may be replaced
(`check_replaceable`), and files a report does not write are never deleted with it: a report
records the names of the files it wrote in its provenance.json ("files", `record_files`), and
the next one replaces those and carries every other entry of the folder over untouched
(`carry_over`).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import sys
import uuid
from pathlib import Path

from ablations.report.pages import path_in
from ablations.results.store import pid_alive

REPORT_SUFFIXES = (".md", ".html", ".csv", ".png", ".json")  # what a report folder may hold
RECORD = "provenance.json"  # where a report records the names of its files, under "files"


def check_replaceable(folder: Path) -> list[str]:
    """The names of the entries of `folder` that a new report there carries over (`carry_over`):
    those its previous report did not write, as that report's provenance.json records them
    (`written_files`); [] for a missing or empty folder. FileExistsError unless `folder` is
    missing, empty or a previous report (report.md among its files); a report that recorded no
    files (written before they were) holds only top-level .md, .html, .csv, .png and .json files
    or links, every one replaced (a link itself, never what it points to)."""
    if folder.parent == folder:
        raise ValueError(f"{folder} cannot be a report folder: it has no parent")
    if not folder.exists():
        return []
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder: the report cannot be written there")
    entries = list(folder.iterdir())
    written = written_files(folder) if (folder / "report.md").is_file() else None
    if written is not None:
        return sorted(p.name for p in entries if p.name not in written)
    other = sorted(
        p.name
        for p in entries
        if p.suffix not in REPORT_SUFFIXES or not (p.is_symlink() or p.is_file())
    )
    if entries and (other or not (folder / "report.md").is_file()):
        held = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "") or "no report.md"
        raise FileExistsError(
            f"{folder} is not empty and not a previous report ({held}); a report replaces its "
            "whole folder: write it to a new folder, or to an earlier report's"
        )
    return []


def written_files(folder: Path) -> set[str] | None:
    """The names of the files the report in `folder` wrote, as its provenance.json records them
    under "files" (`record_files`); None where it records none (no such file, or a report
    written before they were recorded). ValueError for a record that is no list of names."""
    path = folder / RECORD
    if not path.is_file():
        return None
    try:
        names = json.loads(path.read_text(encoding="utf-8")).get("files")
    except (ValueError, AttributeError) as err:
        raise ValueError(f"{path} is not a report's {RECORD}: {err}") from None
    if names is not None and not (
        isinstance(names, list) and all(isinstance(name, str) for name in names)
    ):
        raise ValueError(f'{path}: "files" = {names!r} is not a list of file names')
    return None if names is None else set(names)


def record_files(folder: Path) -> None:
    """Record in `folder`/provenance.json, under "files", the names of every entry of `folder`
    (the report's files, provenance.json among them), sorted: the files the next report into
    its folder replaces (`check_replaceable`)."""
    path = folder / RECORD
    record = json.loads(path.read_text(encoding="utf-8"))
    record["files"] = sorted(p.name for p in folder.iterdir())
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def carry_over(names: list[str], old: Path, new: Path) -> None:
    """Copy the entries `names` of the folder `old` into `new` as they are (a folder whole, a
    link as a link), before `new` replaces `old`: a kill at any instant leaves them in one of
    the two. FileExistsError, naming it, for an entry the new report wrote a file of that name
    for."""
    for name in names:
        source, target = old / name, new / name
        if target.exists() or target.is_symlink():
            raise FileExistsError(
                f"{source} is not a file of the previous report (its {RECORD} does not list it), "
                f"and the new report writes a {name}: move it out of {old} and write the "
                "report again"
            )
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)


def hidden_sibling(final: Path, kind: str) -> Path:
    """A new hidden sibling folder name of `final` for this process: `.<name>.<kind>-<pid>-<hex>`
    (`kind`: "partial", a report being written, or "old", the previous one set aside)."""
    return final.with_name(f".{final.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def recover(final: Path) -> None:
    """Clean up after reports into `final` that were killed: where `final` is missing but a dead
    run set the previous report aside (``.<name>.old-<pid>-*``), put it back; then delete the
    hidden folders of dead runs (of this host: the pid in the name). A live run's are kept."""
    pattern = re.compile(rf"\.{re.escape(final.name)}\.(partial|old)-(\d+)-[0-9a-f]{{8}}")
    dead = []
    for path in final.parent.iterdir() if final.parent.is_dir() else []:
        match = pattern.fullmatch(path.name)
        if match and path.is_dir() and not path.is_symlink() and not pid_alive(int(match[2])):
            dead.append((match[1], path))
    olds = [path for kind, path in dead if kind == "old"]
    if olds and not (final.exists() or final.is_symlink()):
        max(olds, key=lambda path: path.stat().st_mtime_ns).rename(final)
    for _, path in dead:
        shutil.rmtree(path, ignore_errors=True)


RENAME_EXCHANGE = 2  # renameat2 flag: swap the two paths in one step (Linux 3.15)
AT_FDCWD = -100


def exchange(first: Path, second: Path) -> bool:
    """Swap the folders `first` and `second` in one step (Linux renameat2 RENAME_EXCHANGE), so
    that at every instant each path holds one of them: whether it was done (False where the
    system or the file system has no such call)."""
    if sys.platform != "linux":
        return False
    rename = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename is None:  # a C library older than glibc 2.28
        return False
    paths = (AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE)
    if rename(*paths) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def replace_folder(new: Path, final: Path) -> None:
    """Put the complete folder `new` in the place of `final` so that a kill at any instant
    leaves a whole report there, the old or the new one: swap them in one step (`exchange`)
    and delete the old one, now at `new`. Where the file system cannot swap: rename the old
    one aside (``.<name>.old-*``), rename `new` in (renaming the old one back on an error),
    delete the old one; a kill between the two renames leaves `final` missing until the next
    report puts the old one back (`recover`)."""
    if not (final.exists() or final.is_symlink()):
        new.rename(final)
        return
    if exchange(new, final):
        shutil.rmtree(new, ignore_errors=True)
        return
    old = hidden_sibling(final, "old")
    final.rename(old)
    try:
        new.rename(final)
    except BaseException:
        old.rename(final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def new_file(folder: Path, name: str) -> Path:
    """The path of a new file `name` directly inside `folder` (see report_pages.path_in);
    FileExistsError if the report already wrote a file of that name."""
    path = path_in(folder, name)
    if path.exists():
        raise FileExistsError(f"two files of the report are named {name}: a name collision")
    return path
