"""Things built by name: one `Registry` type for every registry, and the unknown-name error.

    NORMS = Registry("norm_type")

    @NORMS.register("rmsnorm")
    class RMSNorm(nn.Module): ...

    NORMS.build("rmsnorm", dim=64)   # kwargs checked against RMSNorm's constructor first
    NORMS.names()                    # ['layernorm', 'none', 'rmsnorm']
    NORMS.describe("rmsnorm")        # its summary line and the kwargs it accepts

Mechanisms, kernel families, symbol retrievers, positional encodings, norms, feed-forward
activations and the ablation tasks are all registries of this type. A taken name is refused
unless the replacement is explicit (``register(name, entry, replace=True)``); every replacement
in any registry is recorded (`replaced_names`, for each cell's environment). A plugin is
imported inside `importing_plugin`: its output goes to stderr (its prints, and what os.system
and subprocesses write), and a failed import leaves nothing it registered behind. This module
is the bottom layer of the library: it imports nothing from attn_zoo.
"""

from __future__ import annotations

import difflib
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, redirect_stdout
from functools import partial
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")
PLUGIN_GROUP = "attn_zoo.plugins"  # the entry-point group installed packages register through
_plugins_loaded = False
_replaced: list[tuple[str, str]] = []  # (registry, name) of each replacement, in order
# While plugins import (`importing_plugin`, nested): (the module whose code made a change, how
# to undo the change), for every change to any registry
_changes: list[tuple[str | None, Callable[[], None]]] = []
_importing = 0


class PluginError(ImportError):
    """A plugin (an entry point of `PLUGIN_GROUP`, or a module a grid or the CLI names) that
    cannot be imported; the message names it and says why in one line."""


def replaced_names() -> list[tuple[str, str]]:
    """(registry, name) of every entry this process replaced (``register(..., replace=True)``
    on a taken name, in any registry), in order: results under such a name may come from
    another entry than the built-in one."""
    return list(_replaced)


def record_change(
    registry: str, name: str, undo: Callable[[], None], replaced: bool = False
) -> None:
    """What a registry calls after adding, replacing or removing its entry `name`: a
    replacement (`replaced`) is recorded for `replaced_names`, and `undo` (which puts the
    registry back as it was) runs if a plugin being imported fails (`importing_plugin`).
    `registry`: its kind, as errors name it ("mechanism", "softmax backend", ...)."""
    if replaced:
        _replaced.append((registry, name))
    if not _importing:
        return

    def take_back() -> None:
        undo()
        if replaced:
            _replaced.remove((registry, name))

    _changes.append((_module_running(), take_back))


def _module_running() -> str | None:
    """The name of the module whose top-level code made the current call (None if none)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back
    return None if frame is None else frame.f_globals.get("__name__")


def check_not_shadowed() -> None:
    """PluginError if the module `attn_zoo` is not this package: a folder named attn_zoo (a
    clone of the repository, a results folder) or an attn_zoo.py in the working folder or
    beside the script comes first on sys.path and hides it (``python -m`` and scripts put
    theirs there), and a plugin's ``attn_zoo.register_mechanism`` is then missing."""
    here = os.path.dirname(os.path.realpath(__file__))
    module = sys.modules.get("attn_zoo")
    found = getattr(module, "__file__", None)
    if module is None or (found is not None and os.path.dirname(os.path.realpath(found)) == here):
        return
    folder = found or next(iter(getattr(module, "__path__", [])), "?")  # a namespace package
    raise PluginError(
        f"`import attn_zoo` finds {folder}, not the attn_zoo package ({here}): a folder or "
        f"file of that name in the working folder or beside the script comes first on "
        f"sys.path and hides the package; rename {folder} or run from another folder"
    )


@contextmanager
def importing_plugin() -> Iterator[list[str]]:
    """The block imports a plugin: first `check_not_shadowed`; its output goes to stderr
    (`_stdout_to_stderr`: a command's stdout stays what the command prints, e.g. `ablate
    best`'s --set lines); if it raises, every registry change made by the code of a module
    that the failure left unimported (the plugin, modules that failed with it) is undone in
    every registry, so that importing it again raises the same error, not "already
    registered". Modules that were imported whole keep theirs (a re-import does not run them
    again). Yields a list that, once the block ends without error, holds the names of the
    modules it imported (those new in sys.modules), in order: the code the plugin brought in
    (ablations/grid/plugins.py digests their files)."""
    global _importing
    check_not_shadowed()
    start = len(_changes)
    before = set(sys.modules)
    brought: list[str] = []
    _importing += 1
    try:
        with _stdout_to_stderr():
            yield brought
        brought += [name for name in list(sys.modules) if name not in before]
    except BaseException:
        for module, take_back in reversed(_changes[start:]):
            if module not in sys.modules:
                take_back()
        raise
    finally:
        _importing -= 1
        del _changes[start:]


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """For the block, sys.stdout and file descriptor 1 (what os.system and subprocesses write
    to) go to stderr; the streams are flushed before and after, and both restored."""
    _flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (a daemon's): only sys.stdout is redirected
        saved = None
    try:
        if saved is not None:
            os.dup2(2, 1)
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _flush()  # before descriptor 1 is back: what the block buffered in sys.__stdout__
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__):
        if stream is not None:
            stream.flush()


def load_entry_point_plugins() -> list[str]:
    """Import every module that an installed package registers under the entry-point group
    `PLUGIN_GROUP` (``[project.entry-points."attn_zoo.plugins"] mine = "my_package.attention"``),
    once per process; the names loaded. Every registry calls it before answering a question
    about its names, so an installed plugin's mechanisms, backends, tasks and retrievers are
    there in any process (a grid's workers included) without an import of its own."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True  # before loading: a plugin that lists a registry does not recurse
    loaded = []
    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            with importing_plugin():
                entry.load()
        except Exception as err:
            _plugins_loaded = False  # the next question raises again, not a silent miss
            raise PluginError(
                f"plugin {entry.name!r} ({entry.value}, entry point group {PLUGIN_GROUP!r}) "
                f"cannot be imported: {' '.join(f'{type(err).__name__}: {err}'.split())}"
            ) from err
        loaded.append(entry.name)
    return loaded


def unknown_name_error(kind: str, name: object, valid: Iterable[str]) -> ValueError:
    """A ValueError naming the bad `name`, the closest valid one and all valid ones."""
    valid = sorted(valid)
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {kind}: {name!r}.{hint} Valid: {', '.join(valid) or '(none)'}.")


EXTRA_KWARGS = "extra_kwargs"  # the class attribute declaring the names an __init__ pops


def keyword_arguments(entry: Callable) -> list[str] | None:
    """The keyword arguments `entry` (a class or a function) accepts, in order; None when it
    takes **kwargs (anything goes). A class's __init__ that takes **kwargs passes them to its
    base's (``super().__init__(d_model, n_heads, **kwargs)``, as a plugin extending a mechanism
    does): the keyword arguments of the __init__ methods up its MRO count too, to the first
    without **kwargs (None if there is none), and so do the names a class declares in its
    `EXTRA_KWARGS` attribute (``extra_kwargs = ("alpha",)``: those its __init__ takes out of
    **kwargs itself, ``alpha = kwargs.pop("alpha", 1.0)``)."""
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if isinstance(entry, type):
        inits = [vars(c)["__init__"] for c in entry.__mro__ if "__init__" in vars(c)]
    else:
        inits = [entry]
    names: list[str] = []
    for init in inits:
        params = list(inspect.signature(init).parameters.values())
        if isinstance(entry, type):
            params = params[1:]  # self
        names += [p.name for p in params if p.kind in keyword and p.name not in names]
        if all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params):
            extra = declared_kwargs(entry) if isinstance(entry, type) else []
            return names + [name for name in extra if name not in names]
    return None


def _takes_var_keyword(function: Callable) -> bool:
    parameters = inspect.signature(function).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def declared_kwargs(entry: type) -> list[str]:
    """The names the classes of `entry`'s MRO declare in `EXTRA_KWARGS` (a tuple of str),
    in order; TypeError naming the class whose declaration is not one."""
    names: list[str] = []
    for cls in entry.__mro__:
        declared = vars(cls).get(EXTRA_KWARGS, ())
        if not isinstance(declared, tuple | list) or not all(isinstance(n, str) for n in declared):
            raise TypeError(
                f"{cls.__qualname__}.{EXTRA_KWARGS} = {declared!r}: must be a tuple of keyword "
                'names, e.g. ("alpha",)'
            )
        names += [name for name in declared if name not in names]
    return names


class Registry(Generic[T]):
    """Entries (classes, factories or objects) by name.

    kind: what an entry is, for error messages ("mechanism", "norm_type", ...).
    base: if given, every registered entry must be a subclass of it.
    """

    def __init__(self, kind: str, base: type | None = None):
        self.kind, self.base = kind, base
        self._entries: dict[str, T] = {}

    def register(
        self, name: str, entry: T | None = None, *, replace: bool = False
    ) -> Callable[[T], T] | T:
        """Register `entry` as `name`; without `entry`, a decorator. A taken name is refused,
        unless `replace` (recorded: `replaced_names`)."""

        def add(entry: T) -> T:
            if not isinstance(name, str) or not name:
                raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
            if self.base is not None and not (
                isinstance(entry, type) and issubclass(entry, self.base)
            ):
                raise TypeError(
                    f"{self.kind} {name!r}: {entry!r} must subclass {self.base.__name__}"
                )
            taken = name in self._entries
            if taken and not replace:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered: {self._entries[name]!r}; "
                    "pass replace=True to replace it (recorded: attn_zoo.registry.replaced_names)"
                )
            if taken:
                undo = partial(self._entries.__setitem__, name, self._entries[name])
            else:
                undo = partial(self._entries.pop, name)
            self._entries[name] = entry
            record_change(self.kind, name, undo, replaced=taken)
            return entry

        return add if entry is None else add(entry)

    def __getitem__(self, name: str) -> T:
        if isinstance(name, str) and name not in self._entries:
            load_entry_point_plugins()
        if not isinstance(name, str) or name not in self._entries:
            raise unknown_name_error(self.kind, name, self._entries)
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            load_entry_point_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def names(self) -> list[str]:
        """Every registered name (installed plugins' included), sorted."""
        load_entry_point_plugins()
        return sorted(self._entries)

    def unregister(self, name: str) -> T:
        """Remove `name` (for tests; a plugin replaces an entry with ``register(...,
        replace=True)``, which is recorded); returns the entry."""
        entry = self[name]
        del self._entries[name]
        record_change(self.kind, name, partial(self._entries.__setitem__, name, entry))
        return entry

    def kwargs(self, name: str) -> list[str] | None:
        """The keyword arguments `build(name, ...)` accepts; None when any are."""
        return keyword_arguments(self[name])

    def check_kwargs(
        self, name: str, kwargs: Iterable[str], exclude: Iterable[str] = (), where: str = ""
    ) -> None:
        """ValueError naming the first of `kwargs` that `name` does not accept (the closest valid
        one suggested). `exclude`: accepted names the caller fills in itself; `where`: the
        argument the kwargs came in (e.g. "sa_kwargs"), for the message."""
        valid = self.kwargs(name)
        if valid is None:
            return
        valid = [k for k in valid if k not in set(exclude)]
        kind = (
            f"key of {where} ({self.kind} {name!r})"
            if where
            else f"keyword argument of {self.kind} {name!r}"
        )
        for key in kwargs:
            if key not in valid:
                error = unknown_name_error(kind, key, valid)
                entry = self[name]
                if isinstance(entry, type) and _takes_var_keyword(entry.__init__):
                    error = ValueError(
                        f"{error} If {entry.__qualname__}.__init__ takes {key!r} out of **kwargs "
                        f"itself, declare it: {EXTRA_KWARGS} = ({key!r},) in the class"
                    )
                raise error

    def build(self, name: str, /, *args, **kwargs) -> object:
        """The entry `name` called with `args` and `kwargs`, the kwargs checked by name first."""
        self.check_kwargs(name, kwargs)
        return self[name](*args, **kwargs)

    def describe(self, name: str) -> str:
        """`name`, the first line of its docstring, and the kwargs it accepts."""
        entry = self[name]
        doc = (inspect.getdoc(entry) or "").strip().splitlines()
        kwargs = self.kwargs(name)
        accepts = "any keyword arguments" if kwargs is None else ", ".join(kwargs) or "(none)"
        return f"{name}: {doc[0] if doc else type(entry).__name__}\n  kwargs: {accepts}"
