"""Deprecated alias of attn_zoo.interop.transformers, kept so that code written against the
old path runs: every name is looked up there, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import warnings


def __getattr__(name: str) -> object:
    warnings.warn(
        "attn_zoo.integrations.transformers moved to attn_zoo.interop.transformers",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module("attn_zoo.interop.transformers"), name)
