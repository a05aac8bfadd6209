import pytest
import torch

from attn_zoo.testing import load_profile

load_profile()
torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture
def restore_registries():
    """Undo mechanism and backend registrations a test makes."""
    from attn_zoo.kernels.dispatch import FAMILIES
    from attn_zoo.registry import MECHANISMS

    mechanisms = dict(MECHANISMS)
    backends = {name: dict(fam.backends) for name, fam in FAMILIES.items()}
    yield
    MECHANISMS.clear()
    MECHANISMS.update(mechanisms)
    for name in list(FAMILIES):
        if name not in backends:
            del FAMILIES[name]
        else:
            FAMILIES[name].backends.clear()
            FAMILIES[name].backends.update(backends[name])
