"""Block masks: which (query tile, key tile) pairs a mask mod leaves empty, full or partial,
derived from the mod itself (as FlexAttention's create_block_mask), so that a tiled kernel
never touches an empty tile and applies no mask on a full one.

    classes[I, J] = EMPTY    mask[b, h, i, j] False for every (b, h) and (i, j) in tile (I, J)
                    FULL     True for every (b, h) and (i, j) in the tile
                    PARTIAL  otherwise,

tile (I, J) holding queries I*block .. (I+1)*block - 1 and keys J*block .. (J+1)*block - 1
(the last ones cut at N and M). A mod reading b or h is classified over all of them: a tile is
empty (skipped) only where it is empty for every batch entry and head, full only where it is
full for every one; the partial tiles apply the mod per (b, h). The mod is evaluated one query
tile at a time against every key: O(B H block M) memory (B, H: 1 for a mod that does not read
them), O(N M) time once per mod and shape. An impure mod (pure = False) cannot be classified
ahead: every tile is PARTIAL.

Cached (`CACHE_SIZE` entries, least recently used dropped) under the mod's `mod_key` (mods.py):
its code and the values it reads, so that a mod rebuilt for every forward (shift_queries, a
mechanism's mod) is classified once per shape, and a mod computing another mask (another
window, a captured tensor changed in place) is never given a stale block mask. A mod that
cannot be keyed (a callable instance, a bound method, a global object it reads) is classified
on every call.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from attn_zoo.kernels.softmax.mods import (
    CACHE_SIZE,
    MaskMod,
    apply_mask_mod,
    is_pure,
    mod_indices,
    mod_key,
)

EMPTY, PARTIAL, FULL = 0, 1, 2

# (mod_key, B, H, N, M, block, device) -> (classes, the tensors the key names: kept alive so
# that their ids, in the key, are not reused while the entry lives)
_CACHE: OrderedDict[tuple, tuple[torch.Tensor, list[torch.Tensor]]] = OrderedDict()


def block_mask(
    mask_mod: MaskMod, b: int, h: int, n: int, m: int, block: int, device
) -> torch.Tensor:  # (ceil(N / block), ceil(M / block)) int8 on the CPU
    """The tile classes (EMPTY, PARTIAL, FULL: module docstring) of `mask_mod` over batch `b`,
    heads `h`, `n` queries and `m` keys in tiles of `block`; cached by `mod_key` (a copy is
    returned). ValueError for a `block` that is not a positive int. Under torch.compile the
    cache is not read (its keys hold code objects, which Dynamo cannot trace): the graph
    classifies the tiles."""
    if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
        raise ValueError(f"block={block!r}: must be a positive int (queries and keys per tile)")
    if not is_pure(mask_mod):
        return torch.full((-(-n // block), -(-m // block)), PARTIAL, dtype=torch.int8)
    if torch.compiler.is_compiling():
        return classify(mask_mod, b, h, n, m, block, device)
    tensors: list[torch.Tensor] = []
    key = mod_key(mask_mod, tensors)
    if key is None:
        return classify(mask_mod, b, h, n, m, block, device)
    key = (key, b, h, n, m, block, str(torch.device(device)))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key][0].clone()
    classes = classify(mask_mod, b, h, n, m, block, device)
    _CACHE[key] = (classes, tensors)
    if len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return classes.clone()


def classify(
    mask_mod: MaskMod, b: int, h: int, n: int, m: int, block: int, device
) -> torch.Tensor:  # (ceil(N / block), ceil(M / block)) int8 on the CPU
    """`block_mask` computed: the mod on each query tile against every key (padded to whole
    key tiles: with False for "any key allowed", with True for "every key allowed")."""
    n_key_tiles = -(-m // block)
    if n == 0 or m == 0:  # no tile to classify: the mod is not called on empty ranges
        return torch.zeros((-(-n // block), n_key_tiles), dtype=torch.int8)
    pad = n_key_tiles * block - m
    rows = []
    for i0 in range(0, n, block):
        allowed = apply_mask_mod(
            mask_mod, mod_indices(b, h, (i0, min(i0 + block, n)), (0, m), device)
        )
        lead = allowed.shape[:-1]
        tiled = [
            torch.cat([allowed, allowed.new_full((*lead, pad), fill)], dim=-1)
            .unflatten(-1, (n_key_tiles, block))
            .movedim(-2, 0)
            .flatten(1)
            for fill in (False, True)
        ]  # each (key tiles, B H bq block)
        some, every = tiled[0].any(dim=1), tiled[1].all(dim=1)
        rows.append(torch.where(every, FULL, torch.where(some, PARTIAL, EMPTY)))
    return torch.stack(rows).to(device="cpu", dtype=torch.int8)
