"""Caches for incremental (KV-cached) decoding.

A `Cache` belongs to one model and one batch of sequences: a `LayerCache` per block and
`length`, the positions the model has processed (the offset of the next call's first
position: learned and sinusoidal positions, RoPE tables and positional symbols are read from
there). ``model(idx_new, cache=cache)`` runs only the new tokens and extends the cache.

A `LayerCache` is what one attention mechanism keeps between calls, and the mechanism decides
what that is (its docstring says):

    standard       k (after RoPE), v                        (B, Hkv, M, d): kv heads under GQA
    relational     k (after RoPE), kr, v (symbol values)    relative symbols: k, kr only
    dual           a child cache per branch ("sa", "ra")
    linear         the recurrent state S (B, Hkv, dk, dv), z (B, Hkv, dk)
    additive       the two online-softmax pooling states (max, sum, weighted sum) per head

`length` is the positions the layer has seen; a mechanism reads it as its offset and advances
it (`advance`) by the positions of each call. Tensors cached by position (`append`) are
concatenated, as Hugging Face's DynamicCache does (contiguous for the kernels, safe under
autograd; the copy is a few microseconds a step at these sizes), at most `capacity` positions
(the model's max_block_size).
"""

from __future__ import annotations

import torch


class LayerCache:
    """One mechanism's state between calls: `length` positions seen, named tensors, children."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.length = 0
        self.state: dict[str, torch.Tensor] = {}  # recurrent state, replaced by the mechanism
        self.tensors: dict[str, torch.Tensor] = {}  # cached by position, (B, H, M, d)
        self.children: dict[str, LayerCache] = {}

    def child(self, name: str) -> LayerCache:
        """The sub-cache `name` (e.g. one branch of dual attention), made on first use."""
        if name not in self.children:
            self.children[name] = LayerCache(self.capacity)
        return self.children[name]

    def append(self, **new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each named (B, H, n, d) tensor placed after the positions cached under its name
        (dim 2); returns the cached tensors, (B, H, M, d) with M = cached + n, in order."""
        return tuple(self._append(name, t) for name, t in new.items())

    def _append(self, name: str, new: torch.Tensor) -> torch.Tensor:
        old = self.tensors.get(name)
        end = new.shape[2] + (0 if old is None else old.shape[2])
        if self.capacity is not None and end > self.capacity:
            raise ValueError(
                f"cache {name!r}: {end} positions exceed its capacity of {self.capacity}"
            )
        full = new if old is None else torch.cat([old, new], dim=2)
        self.tensors[name] = full
        return full

    def cached(self, name: str) -> torch.Tensor | None:
        """The positions cached under `name` so far, or None."""
        return self.tensors.get(name)

    def advance(self, n: int) -> None:
        """Count `n` more positions seen (the mechanism calls it after each call)."""
        self.length += n


class Cache:
    """A model's cache for one batch: a `LayerCache` per layer and `length`, the positions
    processed so far (advanced by the model)."""

    def __init__(self, n_layers: int, capacity: int | None = None):
        self.capacity = capacity
        self.length = 0
        self.layers = [LayerCache(capacity) for _ in range(n_layers)]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, layer: int) -> LayerCache:
        return self.layers[layer]

    def advance(self, n: int) -> None:
        self.length += n

    def __repr__(self) -> str:
        return f"Cache(layers={len(self.layers)}, length={self.length}, capacity={self.capacity})"
