"""The registry of symbol retrievers (where relational attention's symbols come from)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from attn_zoo.registry import Registry

SYMBOL_RETRIEVERS: Registry[type[nn.Module]] = Registry("symbol_retrieval", base=nn.Module)


def register_symbol_retriever(name: str, replace: bool = False) -> Callable[[type], type]:
    """Class decorator: make a retriever buildable as `name`. Its constructor's first
    argument is the symbol width (the model's d_model). A taken name is refused unless
    `replace`, which is recorded (`attn_zoo.registry.replaced_names`)."""
    return SYMBOL_RETRIEVERS.register(name, replace=replace)


def list_symbol_retrievers() -> list[str]:
    return SYMBOL_RETRIEVERS.names()


def build_symbol_retriever(name: str, d_model: int, **kwargs) -> nn.Module:
    """Build retriever `name` for symbols of width `d_model`; kwargs checked by name."""
    width = SYMBOL_RETRIEVERS.kwargs(name)[0]
    SYMBOL_RETRIEVERS.check_kwargs(name, kwargs, exclude=[width], where="symbol_retrieval_kwargs")
    return SYMBOL_RETRIEVERS[name](**{width: d_model}, **kwargs)
