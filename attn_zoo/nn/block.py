"""Deprecated: moved to attn_zoo.models.block (this path is removed in attn_zoo 0.3)."""

from attn_zoo.models import block as new
from attn_zoo.names import deprecated_alias

deprecated_alias(__name__, new)
