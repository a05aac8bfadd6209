"""attn_zoo: interchangeable attention mechanisms and backends, one model family, ablations.

Build a mechanism by name, run it, switch its kernel:

    import attn_zoo as az
    m = az.build("standard", d_model=64, n_heads=4, backend="auto")
    y = m(x, attn_mask=None, is_causal=True)       # (B, N, D) -> (B, N, D)
    m.backend = "chunked"                          # same parameters, other kernel
"""

from attn_zoo import mechanisms  # noqa: F401  (registers the built-in mechanisms)
from attn_zoo.kernels import Capabilities, UnsupportedCallError, explain, register_backend
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.registry import (
    backend_status,
    build,
    list_backends,
    list_mechanisms,
    mechanism_kwargs,
    register_mechanism,
    set_backend,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionMechanism",
    "Capabilities",
    "UnsupportedCallError",
    "backend_status",
    "build",
    "explain",
    "list_backends",
    "list_mechanisms",
    "mechanism_kwargs",
    "register_backend",
    "register_mechanism",
    "set_backend",
]
