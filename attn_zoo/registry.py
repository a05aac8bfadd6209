"""Things built by name: one `Registry` type for every registry, and the unknown-name error.

    NORMS = Registry("norm_type")

    @NORMS.register("rmsnorm")
    class RMSNorm(nn.Module): ...

    NORMS.build("rmsnorm", dim=64)   # kwargs checked against RMSNorm's constructor first
    NORMS.names()                    # ['layernorm', 'none', 'rmsnorm']
    NORMS.describe("rmsnorm")        # its summary line and the kwargs it accepts

Mechanisms, kernel families, symbol retrievers, positional encodings, norms, feed-forward
activations and the ablation tasks are all registries of this type. This module is the bottom
layer of the library: it imports nothing from attn_zoo.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")
PLUGIN_GROUP = "attn_zoo.plugins"  # the entry-point group installed packages register through
_plugins_loaded = False


class PluginError(ImportError):
    """A plugin (an entry point of `PLUGIN_GROUP`, or a module a grid or the CLI names) that
    cannot be imported; the message names it and says why in one line."""


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


def keyword_arguments(entry: Callable) -> list[str] | None:
    """The keyword arguments `entry` (a class or a function) accepts, in order; None when it
    takes **kwargs (anything goes)."""
    target = entry.__init__ if isinstance(entry, type) else entry
    params = list(inspect.signature(target).parameters.values())
    if isinstance(entry, type):
        params = params[1:]  # self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in keyword]


class Registry(Generic[T]):
    """Entries (classes, factories or objects) by name.

    kind: what an entry is, for error messages ("mechanism", "norm_type", ...).
    base: if given, every registered entry must be a subclass of it.
    """

    def __init__(self, kind: str, base: type | None = None):
        self.kind, self.base = kind, base
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None) -> Callable[[T], T] | T:
        """Register `entry` as `name`; without `entry`, a decorator. A name is registered once."""

        def add(entry: T) -> T:
            if not isinstance(name, str) or not name:
                raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
            if self.base is not None and not (
                isinstance(entry, type) and issubclass(entry, self.base)
            ):
                raise TypeError(
                    f"{self.kind} {name!r}: {entry!r} must subclass {self.base.__name__}"
                )
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered: {self[name]!r}")
            self._entries[name] = entry
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
        """Remove `name` (for tests and plugins that replace an entry); returns the entry."""
        self[name]  # noqa: B018  (the unknown-name error)
        return self._entries.pop(name)

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
                raise unknown_name_error(kind, key, valid)

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
