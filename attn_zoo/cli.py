"""Deprecated: moved to ablations.cli (this path is removed in attn_zoo 0.3)."""

from ablations import cli as new
from attn_zoo.names import deprecated_alias

if __name__ == "__main__":  # python -m attn_zoo.cli, as before
    deprecated_alias("attn_zoo.cli", new)
    raise SystemExit(new.main())
deprecated_alias(__name__, new)
