"""The mechanism registry: build any attention mechanism by name.

@register_mechanism("my_attention")
class MyAttention(AttentionMechanism): ...

build("my_attention", d_model=64, n_heads=4, backend="auto")
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.registry import Registry

MECHANISMS: Registry[type[AttentionMechanism]] = Registry("mechanism", base=AttentionMechanism)


def register_mechanism(name: str, replace: bool = False) -> Callable[[type], type]:
    """Class decorator: make `cls` buildable as `name`. A taken name (a built-in's, another
    plugin's) is refused unless `replace`, which is recorded
    (`attn_zoo.registry.replaced_names`)."""
    return MECHANISMS.register(name, replace=replace)


def mechanism_class(name: str) -> type[AttentionMechanism]:
    """The class registered as `name` (ValueError with the closest valid name if none)."""
    return MECHANISMS[name]


def list_mechanisms() -> list[str]:
    """Names of every registered mechanism, sorted."""
    return MECHANISMS.names()


def list_backends(mechanism: str) -> list[str]:
    """Every backend name `mechanism` accepts (``auto`` is always accepted too)."""
    return mechanism_class(mechanism).backend_names()


def backend_status(mechanism: str, backend: str, device: str = "cpu") -> tuple[bool, str]:
    """(ok, reason) for running `mechanism` with `backend` on `device`."""
    return mechanism_class(mechanism).backend_status(backend, device)


def mechanism_kwargs(mechanism: str) -> list[str]:
    """The keyword arguments `build(mechanism, ...)` accepts."""
    return MECHANISMS.kwargs(mechanism) or []


def build(mechanism: str, backend: str = "auto", **kwargs) -> AttentionMechanism:
    """Build the mechanism `mechanism` with `kwargs`, validated before construction."""
    mechanism_class(mechanism).check_backend(backend)
    return MECHANISMS.build(mechanism, backend=backend, **kwargs)


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
