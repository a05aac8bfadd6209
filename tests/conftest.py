import os
import sys
from pathlib import Path

import pytest

# OpenMP's idle threads sleep rather than spin (read when torch loads OpenMP, below; the
# processes the tests start inherit it): spinning, a test on 2 threads burnt a core waiting
# whenever the other process on the machine held one (the tests that take 2 threads, in
# tests/test_softmax_kernels.py, test_relational_kernels.py, test_testing_kit.py, test_mods.py,
# test_additive_attention.py and test_linear_attention.py: 220 s of CPU spinning, 146 s
# passive). The results are the same: only how an idle thread waits changes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after OMP_WAIT_POLICY)

from attn_zoo.testing import load_profile

load_profile()
# The cores shared among the test processes (pytest-xdist's workers): two processes of two
# threads each on two cores spin-wait for each other, and a tiny model's step took 4x longer.
# A test that needs another count sets it (and puts it back).
THREADS = max(1, torch.get_num_threads() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))
torch.set_num_threads(THREADS)
# and the processes the tests start (the CLI, a grid's driver, a script) start with it too; a
# grid's workers set their own count per cell (ablations/run/cell_worker.py)
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))


ROOT = Path(__file__).resolve().parents[1]


def registries() -> list:
    """Every registry of the library and the application (attn_zoo.registry.Registry)."""
    from ablations.tasks.registry import TASKS
    from attn_zoo.kernels.dispatch import FAMILIES
    from attn_zoo.kernels.softmax.mods import MODS
    from attn_zoo.mechanisms.registry import MECHANISMS
    from attn_zoo.models.norms import NORMS
    from attn_zoo.models.positional import POSITIONAL
    from attn_zoo.symbols.registry import SYMBOL_RETRIEVERS

    return [TASKS, FAMILIES, MODS, MECHANISMS, NORMS, POSITIONAL, SYMBOL_RETRIEVERS]


@pytest.fixture(autouse=True)
def restore_registries(tmp_path_factory):
    """Around every test: every registry, every kernel family's backends and the record of
    replaced names put back as they were (added, replaced and removed entries alike), and the
    plugin modules the test imported (files under examples/ or pytest's temporary folders)
    taken out of sys.modules, so that importing one again runs it again. A test registering
    a mechanism or importing a plugin leaves nothing behind for the next test of its worker
    (two coverage tests failed when one did)."""
    from attn_zoo import registry
    from attn_zoo.kernels.dispatch import FAMILIES

    entries = [(r, dict(r._entries)) for r in registries()]
    backends = {name: dict(family.backends) for name, family in FAMILIES._entries.items()}
    replaced = list(registry._replaced)
    modules = set(sys.modules)
    yield
    for r, saved in entries:
        r._entries.clear()
        r._entries.update(saved)
    for name, saved in backends.items():
        FAMILIES._entries[name].backends.clear()
        FAMILIES._entries[name].backends.update(saved)
    registry._replaced[:] = replaced
    plugin_folders = (str(ROOT / "examples"), str(tmp_path_factory.getbasetemp()))
    for name in set(sys.modules) - modules:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(plugin_folders):
            del sys.modules[name]


@pytest.fixture
def example_plugin():
    """examples/sliding_window.py imported as a plugin (ablations.grid.plugins); taken out of
    the process after the test (`restore_registries`)."""
    from ablations.grid.plugins import import_plugins

    example = ROOT / "examples" / "sliding_window.py"
    import_plugins([str(example)])
    return example
