"""The registry of symbol retrievers."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from attn_zoo.kernels.dispatch import unknown_name_error

SYMBOL_RETRIEVERS: dict[str, type[nn.Module]] = {}


def register_symbol_retriever(name: str) -> Callable[[type], type]:
    """Class decorator: make a retriever buildable as `name`. Its constructor's first
    argument is the symbol width (the model's d_model)."""

    def decorate(cls: type) -> type:
        SYMBOL_RETRIEVERS[name] = cls
        return cls

    return decorate


def list_symbol_retrievers() -> list[str]:
    return sorted(SYMBOL_RETRIEVERS)


def build_symbol_retriever(name: str, d_model: int, **kwargs) -> nn.Module:
    """Build retriever `name` for symbols of width `d_model`; kwargs checked by name."""
    if name not in SYMBOL_RETRIEVERS:
        raise unknown_name_error("symbol_retrieval", name, SYMBOL_RETRIEVERS)
    cls = SYMBOL_RETRIEVERS[name]
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    width, valid = params[0], params[1:]
    for key in kwargs:
        if key not in valid:
            raise unknown_name_error(f"symbol_retrieval_kwargs key for {name!r}", key, valid)
    return cls(**{width: d_model}, **kwargs)
