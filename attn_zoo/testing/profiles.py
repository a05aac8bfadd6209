"""Hypothesis profiles: ``ci`` (default: fast, deterministic) and ``thorough`` (long runs).

Select with the environment variable HYPOTHESIS_PROFILE=thorough; call `load_profile()` from a
conftest.py.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=400,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def load_profile() -> str:
    """Load the profile named by HYPOTHESIS_PROFILE (default ``ci``); returns its name."""
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    settings.load_profile(name)
    return name
