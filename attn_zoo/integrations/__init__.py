"""Deprecated: other libraries' modules and attention now live in one package, attn_zoo.interop
(the Hugging Face attention implementations: attn_zoo/interop/transformers.py)."""
