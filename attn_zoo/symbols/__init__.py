"""Symbol retrieval: where relational attention's symbols s_j come from.

Retrievers are registered by name and built with the model width:

    build_symbol_retriever("symbolic_attention", d_model=64, n_symbols=16, n_heads=4)
    build_symbol_retriever("positional_symbols", d_model=64, max_length=128)
    build_symbol_retriever("position_relative", d_model=64, max_rel_pos=8)
"""

from attn_zoo.symbols.registry import (
    SYMBOL_RETRIEVERS,
    build_symbol_retriever,
    list_symbol_retrievers,
    register_symbol_retriever,
)
from attn_zoo.symbols.retrievers import (
    PositionalSymbolRetriever,
    PositionRelativeSymbolRetriever,
    RelativeSymbols,
    SymbolicAttention,
)

__all__ = [
    "SYMBOL_RETRIEVERS",
    "PositionRelativeSymbolRetriever",
    "PositionalSymbolRetriever",
    "RelativeSymbols",
    "SymbolicAttention",
    "build_symbol_retriever",
    "list_symbol_retrievers",
    "register_symbol_retriever",
]
