"""Deprecated paths: block, feed-forward, norms and positions moved to attn_zoo.models, rotary
to attn_zoo.kernels (these aliases are removed in attn_zoo 0.3)."""
