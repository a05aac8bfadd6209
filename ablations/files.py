"""What tells one content of a file from another without reading it: the key under which a
file's digest (ablations/run/provenance.py) or its parsed data (ablations/tasks/
relations_game_files.py) is cached."""

from __future__ import annotations

import os
from pathlib import Path


def file_state(path: str | Path) -> tuple[int, ...]:
    """The state of the file at `path` (a link followed; OSError for none): its device and
    inode (another file put in its place, or a link repointed to one of the same size and
    time, is another inode), size, modification and change times (a rewrite that puts the
    modification time back changes the change time)."""
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns
