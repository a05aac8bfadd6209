"""A report's folder, written whole or not at all: the report is written into a hidden sibling
folder that then replaces the old one in one step (Linux renameat2 RENAME_EXCHANGE; elsewhere
two renames, repaired by the next report), and what killed reports left is cleaned up.

Only a folder that is missing, empty or a previous report may be replaced
(`check_replaceable`): files a report does not write are never deleted with it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import sys
import uuid
from pathlib import Path

from ablations.report.pages import path_in
from ablations.results.store import pid_alive

REPORT_SUFFIXES = (".md", ".html", ".csv", ".png", ".json")  # what a report folder may hold


def check_replaceable(folder: Path) -> None:
    """FileExistsError unless `folder` is missing, empty or a previous report (only top-level
    .md, .html, .csv, .png and .json files or links, report.md among them): replacing it
    deletes what it holds (a link itself, never what it points to)."""
    if folder.parent == folder:
        raise ValueError(f"{folder} cannot be a report folder: it has no parent")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder: the report cannot be written there")
    entries = list(folder.iterdir())
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
