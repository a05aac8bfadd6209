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

Cached (`CACHE_SIZE` entries, least recently used dropped) under the mod's `mod_key`: its
code and the values it reads, so that a mod rebuilt for every forward (shift_queries, a
mechanism's mod) is classified once per shape, and a mod computing another mask (another
window, a captured tensor changed in place) is never given a stale block mask. A mod that
cannot be keyed (a callable instance, a bound method, a global object it reads) is classified
on every call.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections import OrderedDict

import torch

from attn_zoo.kernels.softmax.mods import MaskMod, apply_mask_mod, is_pure, mod_indices

EMPTY, PARTIAL, FULL = 0, 1, 2
CACHE_SIZE = 64
KEY_DEPTH = 8  # steps from the mod (a closure cell, an item, a global) that a key follows
KEY_ELEMENTS = 4096  # the largest tensor a mod reads that is keyed (by its bytes): a larger one is
# read afresh, its tiles classified again at every call
# Libraries whose functions, classes and modules a mod may name (torch.where, this library's
# checked_result): keyed by name, taken as unchanging (a function defined inside another, a
# closure, is keyed by what it reads)
STABLE_MODULES = frozenset(
    {"attn_zoo", "builtins", "torch", "math", "operator", "functools", "itertools", "einops"}
)
_SCALARS = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)

# (mod_key, B, H, N, M, block, device) -> (classes, the tensors the key names: kept alive so
# that their ids, in the key, are not reused while the entry lives)
_CACHE: OrderedDict[tuple, tuple[torch.Tensor, list[torch.Tensor]]] = OrderedDict()


def block_mask(
    mask_mod: MaskMod, b: int, h: int, n: int, m: int, block: int, device
) -> torch.Tensor:  # (ceil(N / block), ceil(M / block)) int8 on the CPU
    """The tile classes (EMPTY, PARTIAL, FULL: module docstring) of `mask_mod` over batch `b`,
    heads `h`, `n` queries and `m` keys in tiles of `block`; cached by `mod_key` (a copy is
    returned). ValueError for a `block` that is not a positive int."""
    if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
        raise ValueError(f"block={block!r}: must be a positive int (queries and keys per tile)")
    if not is_pure(mask_mod):
        return torch.full((-(-n // block), -(-m // block)), PARTIAL, dtype=torch.int8)
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


class _Unkeyable(Exception):
    """A value a mod reads that `mod_key` cannot key."""


def mod_key(mod: object, tensors: list[torch.Tensor]) -> tuple | None:
    """A hashable key equal for two mods only if they compute the same mask: a function's
    code with the keys of what it reads (closure, defaults, attributes, the globals its code
    names), a partial's function and arguments, values by value (containers item by item),
    a tensor of at most `KEY_ELEMENTS` elements by its dtype, shape and bytes (appended to
    `tensors`; a larger one cannot be keyed), the functions, classes and modules of
    `STABLE_MODULES` by name; None if anything else is read (a callable instance, an object,
    a bound method, a module of another library), or it is deeper than `KEY_DEPTH`."""
    try:
        return _key(mod, tensors, set(), KEY_DEPTH)
    except _Unkeyable:
        return None


def _key(value: object, tensors: list[torch.Tensor], path: set[int], depth: int) -> object:
    """`value`'s key; `path`: the ids of the containers and functions it was reached through
    (a cycle back to one cannot be keyed)."""
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    if isinstance(value, torch.Tensor):  # by content: `t.data = ...`, a NumPy array sharing
        if value.numel() > KEY_ELEMENTS:  # its memory or set_() change it with no version bump
            raise _Unkeyable
        tensors.append(value)
        flat = value.detach().reshape(-1).cpu()
        return (
            "tensor",
            str(value.dtype),
            tuple(value.shape),
            bytes(flat.view(torch.uint8).numpy()),
        )
    if isinstance(value, types.ModuleType | types.BuiltinFunctionType | type) or _top_level(value):
        module = value.__name__ if isinstance(value, types.ModuleType) else value.__module__
        if (module or "").split(".")[0] not in STABLE_MODULES:
            raise _Unkeyable
        return ("named", module, getattr(value, "__qualname__", value.__name__))
    if depth < 0 or id(value) in path:
        raise _Unkeyable
    path.add(id(value))
    try:
        return _inner_key(value, tensors, path, depth - 1)
    finally:
        path.discard(id(value))


def _inner_key(value: object, tensors: list[torch.Tensor], path: set[int], inner: int) -> tuple:
    """The key of a container, a partial or a function (`_key`), its parts `inner` deep."""

    def each(values) -> tuple:
        return tuple(_key(v, tensors, path, inner) for v in values)

    if isinstance(value, list | tuple):
        return (type(value).__name__, each(value))
    if isinstance(value, set | frozenset):
        return ("set", frozenset(each(value)))
    if isinstance(value, dict):
        return ("dict", each(value.keys()), each(value.values()))
    if isinstance(value, functools.partial):
        return ("partial", each([value.func, value.args, value.keywords]))
    if inspect.isfunction(value):
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # a free variable not yet assigned
                cells.append(None)
        names = _names(value.__code__)
        named = {name: value.__globals__[name] for name in names if name in value.__globals__}
        parts = [cells, value.__defaults__, value.__kwdefaults__, vars(value), named]
        return ("function", value.__code__, each(parts))
    raise _Unkeyable


def _top_level(value: object) -> bool:
    """Whether `value` is a function of a `STABLE_MODULES` library at its module's top level
    (no closure: the library's code, keyed by name)."""
    return (
        inspect.isfunction(value)
        and value.__closure__ is None
        and "<locals>" not in value.__qualname__
        and (value.__module__ or "").split(".")[0] in STABLE_MODULES
    )


def _names(code: types.CodeType) -> list[str]:
    """The global (and attribute) names `code` and the code nested in it (a generator
    expression, a lambda) use."""
    nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return [*code.co_names, *(name for c in nested for name in _names(c))]
