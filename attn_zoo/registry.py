"""Registries by name: attention mechanisms (here) and kernel backends (kernels.dispatch).

@register_mechanism("my_attention")
class MyAttention(AttentionMechanism): ...

build("my_attention", d_model=64, n_heads=4, backend="auto")
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from attn_zoo.kernels.dispatch import unknown_name_error
from attn_zoo.mechanisms.base import AttentionMechanism

MECHANISMS: dict[str, type[AttentionMechanism]] = {}


def register_mechanism(name: str) -> Callable[[type], type]:
    """Class decorator: make `cls` buildable as `name`."""

    def decorate(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, AttentionMechanism)):
            raise TypeError(f"mechanism {name!r}: {cls!r} must subclass AttentionMechanism")
        MECHANISMS[name] = cls
        return cls

    return decorate


def mechanism_class(name: str) -> type[AttentionMechanism]:
    if name not in MECHANISMS:
        raise unknown_name_error("mechanism", name, MECHANISMS)
    return MECHANISMS[name]


def list_mechanisms() -> list[str]:
    """Names of every registered mechanism, sorted."""
    return sorted(MECHANISMS)


def list_backends(mechanism: str) -> list[str]:
    """Every backend name `mechanism` accepts (``auto`` is always accepted too)."""
    return mechanism_class(mechanism).backend_names()


def backend_status(mechanism: str, backend: str, device: str = "cpu") -> tuple[bool, str]:
    """(ok, reason) for running `mechanism` with `backend` on `device`."""
    return mechanism_class(mechanism).backend_status(backend, device)


def mechanism_kwargs(mechanism: str) -> list[str]:
    """The keyword arguments `build(mechanism, ...)` accepts."""
    params = inspect.signature(mechanism_class(mechanism).__init__).parameters
    return [
        p for p in params if p != "self" and params[p].kind is not inspect.Parameter.VAR_KEYWORD
    ]


def build(mechanism: str, backend: str = "auto", **kwargs) -> AttentionMechanism:
    """Build the mechanism `mechanism` with `kwargs`, validated before construction."""
    cls = mechanism_class(mechanism)
    cls.check_backend(backend)
    valid = mechanism_kwargs(mechanism)
    for key in kwargs:
        if key not in valid:
            raise unknown_name_error(f"keyword argument of {mechanism!r}", key, valid)
    return cls(backend=backend, **kwargs)


def set_backend(model: nn.Module, backend: str) -> nn.Module:
    """Set `backend` on every attention mechanism inside `model`; returns `model`.

    The name is checked against every mechanism first, so a bad name changes nothing.
    """
    mechanisms = [m for m in model.modules() if isinstance(m, AttentionMechanism)]
    if not mechanisms:
        raise ValueError(f"set_backend: no attention mechanism inside {type(model).__name__}")
    for m in mechanisms:
        m.check_backend(backend)
    for m in mechanisms:
        m.backend = backend
    return model
