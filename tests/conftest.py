import pytest
import torch

from attn_zoo.testing import load_profile

load_profile()
torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture
def restore_registries():
    """Undo mechanism and backend registrations a test makes."""
    from attn_zoo.kernels.dispatch import FAMILIES
    from attn_zoo.mechanisms.registry import MECHANISMS

    mechanisms = set(MECHANISMS)
    families = set(FAMILIES)
    backends = {name: dict(FAMILIES[name].backends) for name in families}
    yield
    for name in set(MECHANISMS) - mechanisms:
        MECHANISMS.unregister(name)
    for name in set(FAMILIES) - families:
        FAMILIES.unregister(name)
    for name in families:
        FAMILIES[name].backends.clear()
        FAMILIES[name].backends.update(backends[name])
