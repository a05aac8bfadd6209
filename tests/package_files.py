"""Reference code from installed packages, one file at a time."""

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def package_file(package: str, *path: str) -> ModuleType:
    """The module in file `path` of the installed `package`, loaded on its own, without running
    the package's __init__ (skips the test when the package is not installed). For pure-torch
    reference files in packages whose import does much more: flash-linear-attention loads its
    Triton kernels and models (about 20 s), triton-sigmoid refuses to import without CUDA."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (pip install 'attn_zoo[test]')")
    location = Path(spec.submodule_search_locations[0], *path)
    module_spec = importlib.util.spec_from_file_location(f"{package}_{location.stem}", location)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module
