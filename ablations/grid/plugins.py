"""Your own mechanisms, backends, tasks, symbol retrievers and positional encodings in a grid:
modules imported before any name is resolved, in the driver and in every worker.

    # grid.toml
    imports = ["my_attention"]        # a module on sys.path or beside the grid file,
                                      # or a file: "plugins/my_attention.py"
    attn-zoo ablate run grid.toml --import my_other_module      # the CLI's --import, repeatable

A module registers what it defines when imported (``@attn_zoo.register_mechanism("mine")``,
``@register_task("mine")``, ...). `import_plugins` imports each named module once per process:
a name with a path separator or ending in ".py" is a file, resolved against the grid file's
folder; any other name is a module, looked up on sys.path and then in that folder (one that
sys.path finds elsewhere while a file of its name lies in that folder is refused, naming both:
``imports = ["test"]`` beside a test.py would import Python's own test package). A file is
imported once however it is named (``imports = ["mine.py"]`` and ``--import mine``): one that a
module of this process was loaded from is not imported again. A module that cannot be imported
is one `PluginError` naming it, raised before any cell runs, and leaves nothing it registered
behind (importing it again raises the same error); what a plugin prints as it is imported goes
to stderr, so that a command's stdout is what the command prints (`importing_plugin`). The
resolved names (`GridSpec.imports`) travel with the cells to the executors' worker processes
and Ray tasks, which import them before training; each cell records them with their files'
SHA-256 (ablations.run.provenance), and its resume checkpoints each file of their code, a
helper they import from another folder (a namespace package's too) and every module loaded
from the plugins' folders however it was imported included, with its own digest
(`loaded_plugin_files`). A data file a plugin reads is its input too, but unseen unless its
module declares it, as is a module it loads by path and keeps out of sys.modules
(``importlib.util.spec_from_file_location`` and ``exec_module``: docs/extending.md):

    ATTN_ZOO_FILES = ["settings.json"]    # beside the module: digested with its code

Installed packages need none of this: their entry points (group "attn_zoo.plugins") are loaded
by every registry (attn_zoo/registry.py).
"""

from __future__ import annotations

import ast
import contextlib
import glob
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType

import attn_zoo
from attn_zoo.registry import PluginError, importing_plugin, load_entry_point_plugins

DATA_FILES = "ATTN_ZOO_FILES"  # a plugin module's list of the files it reads (`declared_files`)
_brought: dict[str, list[str]] = {}  # a plugin (resolved name) -> the modules its import
# brought into this process (`importing_plugin`)


def is_file(name: str) -> bool:
    return name.endswith(".py") or "/" in name or "\\" in name


def resolve(names: Sequence[str], folder: Path | None = None) -> list[str]:
    """`names` as any process imports them: a file as its absolute path (a relative one joined
    to `folder`), a module that is not on sys.path but beside `folder` as that file, any other
    module as it is."""
    folder = folder or Path.cwd()
    resolved = []
    for name in names:
        beside = folder / (name.replace(".", "/") + ".py")
        if is_file(name):
            resolved.append(str((folder / Path(name).expanduser()).resolve()))
        elif beside.is_file() and _found(name) is None:
            resolved.append(str(beside.resolve()))
        else:
            resolved.append(name)
    return resolved


def import_plugins(names: Sequence[str], folder: Path | None = None, where: str = "") -> None:
    """Import the installed entry-point plugins and each of `names` (`resolve`d against
    `folder`), once per process; PluginError naming the first that fails (`where`: what named
    it, e.g. "grid.toml imports")."""
    load_entry_point_plugins()
    folder = folder or Path.cwd()
    for i, (named_as, name) in enumerate(zip(names, resolve(names, folder), strict=True)):
        named = f" (named by {where}[{i}])" if where else ""
        _check_not_hidden(named_as, folder, named)
        try:
            _import(name)
        except (Exception, SystemExit) as err:  # a plugin calling sys.exit is a failed import
            raise PluginError(
                f"plugin {name!r}{named} cannot be imported: "
                f"{' '.join(f'{type(err).__name__}: {err}'.split())}"
            ) from err


def _found(name: str) -> str | None:
    """Where sys.path finds module `name`: its file (real path), the folder of a namespace
    package, or what it is ("built-in module sys"); "" when its parent package fails to import
    (finding a dotted name imports it; `_import` then reports the error); None if not found."""
    try:
        with importing_plugin():  # a parent that fails leaves nothing registered
            spec = importlib.util.find_spec(name)
    except (Exception, SystemExit):
        return ""
    if spec is None:
        return None
    if spec.has_location:
        return os.path.realpath(spec.origin)
    folders = list(spec.submodule_search_locations or [])
    return folders[0] if folders else f"{spec.origin} module {name}"


def _check_not_hidden(name: str, folder: Path, named: str) -> None:
    """PluginError if module `name` (as a grid or the CLI names it, `named` saying where) has
    a file of its name in `folder` but sys.path finds another module of that name first (a
    test.py beside the grid and Python's test package): importing the name would silently
    import the other one. The error names both and the fix: name the file."""
    beside = folder / (name.replace(".", "/") + ".py")
    if is_file(name) or not beside.is_file():
        return
    found = _found(name)
    if found and found != os.path.realpath(beside):
        raise PluginError(
            f"plugin {name!r}{named} is ambiguous: the file {beside} has its name, but `import "
            f"{name}` finds {found} on sys.path first and would import that instead; name the "
            f"file to import it ({name.replace('.', '/') + '.py'!r} in place of {name!r}), or "
            f"rename the file if you mean the module sys.path finds"
        )


def _loaded(path: str) -> bool:
    """Whether a module of this process was loaded from the file at `path`."""
    real = os.path.realpath(path)
    files = (getattr(module, "__file__", None) for module in list(sys.modules.values()))
    return any(
        isinstance(file, str)
        and os.path.basename(file) == os.path.basename(real)  # cheap first
        and os.path.realpath(file) == real
        for file in files
    )


def _import(name: str) -> None:
    """Import module `name`, or the file at path `name` as a module named after its path,
    inside `importing_plugin`; nothing when its file is already loaded, under any module
    name."""
    if not is_file(name):
        if name in sys.modules:
            return
        with importing_plugin() as brought:  # finding a dotted name imports its parent package
            spec = importlib.util.find_spec(name)
            if spec is None or not spec.origin or not _loaded(spec.origin):
                importlib.import_module(name)
        _brought[name] = brought
        return
    path = Path(name)
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    module_name = f"attn_zoo_plugin_{path.stem}_{digest}"
    if module_name in sys.modules or _loaded(name):
        return
    if not path.is_file():
        raise FileNotFoundError(f"no plugin file {path}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    with importing_plugin() as brought:
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]  # before `importing_plugin` undoes what it registered
            raise
    _brought[name] = brought


def _library_folders() -> tuple[str, ...]:
    """The folders of code a plugin's digest leaves out: Python's and the installed packages'
    (their versions are the environment's), attn_zoo's and ablations' (the cell's commit records
    them: ablations.run.provenance.source_state)."""
    paths = sysconfig.get_paths()
    folders = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    folders += [Path(attn_zoo.__file__).parent, Path(__file__).parents[1]]  # ablations
    return tuple(os.path.join(os.path.realpath(folder), "") for folder in folders)


def plugin_files(name: str) -> list[str]:
    """The files of plugin `name`'s code in this process (`name` resolved, as `resolve` gives
    it), each once: its own file first (none for a module without one), then, sorted, those
    of its package's modules, loaded or not (``mypkg/impl.py`` of a plugin ``mypkg``), and of
    every other module its import brought in (`importing_plugin`: a helper module beside it)
    that is not part of Python, an installed package, attn_zoo or ablations
    (`_library_folders`), and of the modules their code names in an import statement, however
    late it runs (`_named_imports`); then the data files its loaded modules declare
    (`declared_files`). A file's edit then changes the plugin's digest
    (ablations.run.provenance.plugin_record); a module it loads another way (importlib in a
    forward) is digested in its resume checkpoints (`loaded_plugin_files`)."""
    package: list[str] = []
    if is_file(name):
        own = name
    else:
        spec = importlib.util.find_spec(name)
        own = spec.origin if spec is not None else None
        package = [module for module in list(sys.modules) if module.startswith(f"{name}.")]
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
    own = os.path.realpath(own) if own and os.path.isfile(own) else None
    library = _library_folders()
    files = {  # a package's every module, loaded or not: one imported lazily (in a forward,
        os.path.realpath(path)  # at the first evaluation) is its code as much as the others
        for folder in ([] if is_file(name) else folders)
        for path in _python_files(folder)
    }
    for module in [*package, *_brought.get(name, [])]:
        file = getattr(sys.modules.get(module), "__file__", None)
        if not isinstance(file, str) or not os.path.isfile(file):
            continue
        file = os.path.realpath(file)
        if module in package or not file.startswith(library):
            files.add(file)
    files |= _named_imports([own, *files] if own else list(files), library)
    code = ([own] if own else []) + sorted(files - {own})
    modules = _loaded_modules()
    data = {path for file in code if file in modules for path in declared_files(modules[file])}
    return code + sorted(data - set(code))


def _named_imports(files: list[str], library: tuple[str, ...]) -> set[str]:
    """The files of the modules that the code of `files` names in an import statement
    anywhere (inside a function too: ``import helper`` in a forward runs only at the first
    call, after the plugin was digested), found beside the importing file or on sys.path
    (``from .helper import f``: beside it), outside `library`, and of the modules those name in
    turn (`_module_files`)."""
    found: set[str] = set()
    todo = list(files)
    while todo:
        file = todo.pop()
        try:
            tree = ast.parse(Path(file).read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        folder = Path(file).parent
        # (module, the folder to find it in, and on sys.path?, the names imported from it)
        named: set[tuple[str, Path, bool, tuple[str, ...]]] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            members = tuple(alias.name for alias in node.names)
            if isinstance(node, ast.Import):
                named |= {(name, folder, True, ()) for name in members}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named.add((node.module, folder, True, members))
            elif isinstance(node, ast.ImportFrom) and node.level <= len(folder.parents) + 1:
                base = folder.parents[node.level - 2] if node.level > 1 else folder
                if node.module:  # `from .helper import f`
                    named.add((node.module, base, False, members))
                else:  # `from . import helper`
                    named |= {(name, base, False, ()) for name in members}
        for name, where, on_sys_path, members in sorted(named):
            for path in _module_files(name, [str(where)], on_sys_path, library, members):
                path = os.path.realpath(path)
                if not path.startswith(library) and path not in found and path not in files:
                    found.add(path)
                    todo.append(path)
    return found


def _module_files(
    name: str,
    folders: list[str],
    on_sys_path: bool,
    library: tuple[str, ...],
    members: Sequence[str] = (),
) -> list[str]:
    """The .py files of module `name` ("a.b.c"), found (not imported) in `folders`, else, for
    `on_sys_path`, where sys.path finds it: the first regular package on its way, its every
    module (``import a.b`` of a package a: all of a's code, as a's modules import each other),
    else its own file. A namespace package (a folder without __init__.py, in one folder or
    several) has no code: one on the way leads to the module named in it, one named, to its
    modules named by `members` (``from ns import helper``: ns/helper.py). None for a built-in
    or missing module (`from a import f` of a function f names a), nor for a package in
    `library` (torch's 2,000 files are not listed)."""
    for i, part in enumerate(name.split(".")):
        spec = importlib.machinery.PathFinder.find_spec(part, folders)
        if i == 0 and on_sys_path and (spec is None or spec.origin is None):  # none beside
            with contextlib.suppress(ImportError, ValueError):  # ValueError: no __spec__
                spec = importlib.util.find_spec(part) or spec
        if spec is None:
            return []
        if spec.origin is not None or spec.submodule_search_locations is None:
            break  # a module, a regular package, or one with no file (built-in)
        folders = list(spec.submodule_search_locations)  # a namespace package's folders
    else:  # `name` is a namespace package
        return [
            path for member in members for path in _module_files(member, folders, False, library)
        ]
    origin = os.path.realpath(spec.origin) if spec.has_location else None
    if origin is None or not os.path.isfile(origin) or origin.startswith(library):
        return []
    if os.path.basename(origin) != "__init__.py":
        return [origin]
    return _python_files(os.path.dirname(origin))


def _python_files(folder: str) -> list[str]:
    """The .py files in `folder` and below it."""
    return glob.glob(os.path.join(folder, "**", "*.py"), recursive=True)


def plugin_folders(names: Iterable[str]) -> list[str]:
    """The folders that hold plugins `names` (resolved, as `resolve` gives them, or a
    top-level package's name), sorted: a file's folder, else the folder of the module's
    top-level module or package (its sys.path entry, where ``importlib.import_module("helper")``
    finds a module beside it), as imported here; none inside `_library_folders` (an installed
    package's)."""
    library = _library_folders()
    folders = set()
    for name in names:
        if is_file(name):
            found = name
        else:  # its top-level module as imported here (a namespace package: its folder)
            module = sys.modules.get(name.split(".")[0])
            path = list(getattr(module, "__path__", []))
            found = getattr(module, "__file__", None) or (path[0] if path else None)
        if not isinstance(found, str) or not os.path.exists(found):  # a built-in module
            continue
        found = os.path.realpath(found)
        top = os.path.dirname(found) if os.path.basename(found) == "__init__.py" else found
        folder = os.path.dirname(top)  # `top`: a module's file, a package's folder
        if not os.path.join(folder, "").startswith(library):
            folders.add(folder)
    return sorted(folders)


def loaded_plugin_files(names: Iterable[str]) -> list[str]:
    """Every file of plugins `names`' code and data in this process, sorted, each once: the
    `plugin_files` of each (its own, its package's modules, the helpers it imports wherever
    they lie, the data files they declare), and the files of the modules loaded in this
    process (sys.modules) that lie in a folder of the plugins (`plugin_folders`, or below it)
    but not in `_library_folders`, however they were imported (``importlib.import_module(
    "helper")`` or ``__import__`` in a forward: code that `plugin_files` cannot see in the
    plugins' source), with the data files they declare (`declared_files`). A resume
    checkpoint holds a digest of each (ablations.run.resume.loaded_record)."""
    names = list(names)
    folders = tuple(os.path.join(folder, "") for folder in plugin_folders(names))
    library = _library_folders()
    modules = _loaded_modules()
    code = [file for file in modules if file.startswith(folders) and not file.startswith(library)]
    data = {path for file in code for path in declared_files(modules[file])}
    own = {file for name in names for file in plugin_files(name)}
    return sorted(own | set(code) | data)


def declared_files(module: ModuleType) -> list[str]:
    """The data files that plugin module `module` declares it reads, as real paths: its
    `DATA_FILES` list, names relative to its file's folder (``ATTN_ZOO_FILES =
    ["settings.json"]``); digested with its code, so that an edit of one changes the plugin's
    digest. PluginError naming the module and the entry for one that is not a file."""
    declared = vars(module).get(DATA_FILES, [])
    if isinstance(declared, str) or not isinstance(declared, list | tuple):
        raise PluginError(
            f"plugin module {module.__name__!r} ({module.__file__}): {DATA_FILES} = "
            f"{declared!r} is not a list of file names (e.g. {DATA_FILES} = ['settings.json'])"
        )
    folder = Path(module.__file__).parent
    files = []
    for entry in declared:
        path = folder / entry if isinstance(entry, str | os.PathLike) else None
        if path is None or not path.is_file():
            raise PluginError(
                f"plugin module {module.__name__!r} ({module.__file__}): {DATA_FILES} names "
                f"{entry!r}, which is not a file in {folder}; name the files it reads, "
                f"relative to its folder"
            )
        files.append(os.path.realpath(path))
    return files


def _loaded_modules() -> dict[str, ModuleType]:
    """{real path of its file: module} of the modules loaded in this process from a file (an
    absolute path: ``torch.ops`` says "_ops.py", which is no file of the working folder)."""
    modules = list(sys.modules.values())  # any object: None where an import is blocked
    files = ((getattr(module, "__dict__", {}).get("__file__"), module) for module in modules)
    return {
        _real(file): module
        for file, module in files
        if isinstance(file, str) and os.path.isabs(file) and os.path.isfile(file)
    }


@cache
def _real(file: str) -> str:
    return os.path.realpath(file)
