"""Deprecated: moved to ablations.bench (this path is removed in attn_zoo 0.3)."""

from ablations import bench as new
from attn_zoo.names import deprecated_alias

deprecated_alias(__name__, new)
