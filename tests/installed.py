"""Stand-ins for the site-packages of a fresh environment, built from what is installed here.

    folder = link_dependencies(tmp_path, ["torch", "einops", "ninja"])

`folder` then holds links to the top-level files (packages, modules, .dist-info) of those
distributions and of everything they need in turn: on sys.path, a process sees exactly what
`pip install` of those names would have put there, and nothing else from this environment.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement


def link_dependencies(folder: Path, names: list[str]) -> Path:
    """`folder` filled with links to the installed distributions `names` and their dependency
    closure (each one's requirements by its metadata, without extras); a name that is not
    installed here is passed over. Returns `folder`."""
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = dist.metadata["Name"].lower().replace("-", "_")
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    return folder
