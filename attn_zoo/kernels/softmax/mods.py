"""Score and mask mods: attention variants as small functions of a score and its position, as
FlexAttention writes them (torch.nn.attention.flex_attention).

    score_mod(score, b, h, q_idx, kv_idx) -> the score to use           (ALiBi, softcapping)
    mask_mod(b, h, q_idx, kv_idx) -> True where query q_idx may see key kv_idx   (windows)

Here they are called once per tile with broadcasting index tensors (b (B,1,1,1), h (1,H,1,1),
q_idx (1,1,N,1), kv_idx (1,1,1,M); a tile's ranges in the chunked kernel), so they must be
written with tensor operations (``torch.where``, comparisons, arithmetic), not Python `if`s on
values. Positions count from 0 in q and in k. A mod must be pointwise (elementwise, as
FlexAttention requires): its value at (b, h, i, j) depends only on score[b, h, i, j], the
indices b, h, i, j and the tensors it reads, never on the shape of the tile it is given (naive
calls it on the whole (N, M), chunked per tile, blocks.py per query tile) nor on the other
scores there (top-k, a softmax over keys, "the last 32 keys" read from kv_idx.shape). Naive
and chunked (and the materialised mask of the others) check it before serving a call,
`check_pointwise`: the mod on a drawn problem of up to `PROBE` queries and keys (scores of
several spreads), whole and in tiles of other shapes (chunked's tiles among them), must agree,
else ValueError naming the mod and the difference; once per mod and shape (cached under
`mod_key`; a mod without one is probed at every call). What a mod returns is checked where it
is called, and anything else is refused (ValueError naming the mod, what it returned and what
is valid):

    score_mod: a float tensor of its score's shape (B, H, N, M)
    mask_mod:  a boolean tensor (True = may attend; not attn_mask's additive 0 / -inf) of shape
               (B, H, N, M), where B, H and N may be 1 (the same for every batch entry, head or
               query) but not M (a mask says which keys a query sees)

The softmax family takes them on every backend: naive and chunked apply them (chunked per
tile, skipping the tiles its block mask (blocks.py), derived from the mask mod itself, finds
empty: O(N visible) time and memory for a local mask or any combination of them), sdpa applies
a mask_mod per query tile over the key tiles that block mask keeps (O(N visible) too), the
others get a mask_mod as a materialised boolean mask (O(N M) memory); all but naive and
chunked refuse a score_mod by capability. Mask mods combine with `and_masks`, `or_masks` and
`not_mask`. Gradients flow through a score_mod to q and k, and to the tensors it captures
(`captured_tensors`) on the backends that serve them.

What a mod may declare, as attributes of the function:

    pure             default True: the same result for the same arguments on every call.
                     chunked (and flex) call the mods again in backward, so a mod declaring
                     pure = False (random, stateful) in a call with a backward makes an
                     ``impure_mod`` call, served only by backends calling it once per tile, in
                     the forward (naive; sdpa a mask mod, once per query tile; xformers a
                     mask mod, materialised once).
                     An undeclared impure mod is an error, not a wrong answer: the pointwise
                     check calls it twice on its probe and refuses other values; chunked also
                     checks in backward that the weights it recomputes still sum to 1.
    parameters       tensors the mod reads that `captured_tensors` does not find (its closure,
                     default arguments, a partial's arguments, a callable instance's
                     attributes, the globals its code names; a callable whose code is not
                     Python and declares none counts as capturing one). A score mod
                     capturing a tensor that requires grad makes a ``mod_grad`` call: served
                     where the tensor gets its gradient (naive), refused by the backends
                     recomputing the mod (chunked, flex): ``auto`` picks naive.
    causal_only      (score mods) why the mod is for causal attention only, and the
                     alternative: a mechanism refuses it in a call that is not causal
                     (one-sided ALiBi).
    replaces_causal  (mask mods) the mask is a causal mask itself, opened somewhere
                     (prefix_lm): a mechanism's causal call applies it instead of is_causal.
    relative         the mod reads its positions only as i - j (or none at all): shifting
                     every position alike changes nothing (causal, sliding_window, alibi,
                     softcap). Undeclared, a mod is taken as reading absolute positions
                     (prefix_lm, document, a user's mod): a swapped Hugging Face layer
                     (attn_zoo/interop/surgery.py) refuses it in a call whose positions are
                     not 0..N-1, a left-padded batch.

Named mods (`MODS`, for grid files and mechanism kwargs: ``mask_mod = { name =
"sliding_window", window = 64 }``): causal, sliding_window, prefix_lm, document, alibi, softcap.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import site
import struct
import sys
import sysconfig
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator

import torch
from torch import nn

from attn_zoo.kernels.dispatch import constant_when_compiled
from attn_zoo.registry import Registry

ScoreMod = Callable[..., torch.Tensor]
MaskMod = Callable[..., torch.Tensor]
MODS: Registry[Callable[..., Callable]] = Registry("attention mod")


def mod_indices(
    b: int, h: int, q: tuple[int, int], k: tuple[int, int], device
) -> tuple[torch.Tensor, ...]:
    """Index tensors (b, h, q_idx, kv_idx) broadcasting to (b, h, q1 - q0, k1 - k0), for the
    queries q = (q0, q1) and keys k = (k0, k1)."""
    return (
        torch.arange(b, device=device).view(b, 1, 1, 1),
        torch.arange(h, device=device).view(1, h, 1, 1),
        torch.arange(*q, device=device).view(1, 1, -1, 1),
        torch.arange(*k, device=device).view(1, 1, 1, -1),
    )


def mod_name(mod: Callable) -> str:
    """A mod's name, for messages."""
    return getattr(mod, "__name__", type(mod).__name__)


RETURNS = {  # what each kind of mod returns, for the messages refusing anything else
    "score_mod": "a score mod returns a float tensor of its score's shape (B, H, N, M), "
    "computed from it and the index tensors (e.g. score - (q_idx - kv_idx))",
    "mask_mod": "a mask mod returns a boolean tensor, True where query q_idx may see key "
    "kv_idx, computed from the index tensors (e.g. kv_idx <= q_idx), of shape (B, H, N, M), "
    "B, H or N possibly 1 (an additive 0 / -inf mask is attn_mask's convention, or a score "
    "mod's)",
}


def checked_result(
    kind: str, mod: Callable, result: object, shape=None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`result` of the mod `mod` (`kind`: "score_mod" or "mask_mod"), or ValueError naming the
    mod, what it returned and `RETURNS[kind]` (the same message on every backend, but for the
    sizes of a wrong shape); `shape`: the score's (B, H, N, M) (the call's index tensors
    broadcast), None to check the type only (FlexAttention's scalar calls); `dtype`: the
    score's, which a score mod's result must hold (``torch.promote_types(result, dtype)`` is
    the result's dtype: float32 from a float64 score would compute the float64 reference in
    float32), None for no such check."""
    score = kind == "score_mod"
    if not isinstance(result, torch.Tensor):
        got = f"{type(result).__name__} {result!r}, not a tensor"
    elif not (result.is_floating_point() if score else result.dtype == torch.bool):
        got = f"a {result.dtype} tensor"
    elif shape is not None and not _fits(result.shape, shape, exact=score):
        got = f"shape {tuple(result.shape)} (B, H, N, M here: {tuple(shape)})"
    elif score and dtype is not None and torch.promote_types(result.dtype, dtype) != result.dtype:
        got = f"a {result.dtype} tensor from a {dtype} score (narrower than it: return {dtype})"
    else:
        return result
    raise ValueError(f"{kind} {mod_name(mod)} returned {got}: {RETURNS[kind]}")


def _fits(got: torch.Size, shape: torch.Size, exact: bool) -> bool:
    """`got` is `shape`, or (not `exact`) `shape` with 1 for any of its first three sizes."""
    if exact or len(got) != 4:
        return tuple(got) == tuple(shape)
    return got[3] == shape[3] and all(g in (1, s) for g, s in zip(got[:3], shape[:3], strict=True))


def apply_mask_mod(mask_mod: MaskMod, indices: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """`mask_mod` on the index tensors `indices` (`mod_indices`: a whole call's or a tile's),
    its result checked: boolean (B or 1, H or 1, N or 1, M)."""
    shape = torch.broadcast_shapes(*(i.shape for i in indices))
    return checked_result("mask_mod", mask_mod, mask_mod(*indices), shape)


def mask_from_mod(mask_mod: MaskMod, b: int, h: int, n: int, m: int, device) -> torch.Tensor:
    """`mask_mod` materialised: boolean (B, H, N, M) (an expanded view). Not checked pointwise
    here: a call is, once, where its inputs are (family.check_inputs, naive's
    attention_weights)."""
    return apply_mask_mod(mask_mod, mod_indices(b, h, (0, n), (0, m), device)).expand(b, h, n, m)


def apply_score_mod(score_mod: ScoreMod | None, scores: torch.Tensor, indices) -> torch.Tensor:
    """`scores` (B, H, N, M), a whole call's, through `score_mod` (None: as they are), checked
    per result (`modded_scores`)."""
    return modded_scores(score_mod, scores, indices)


def modded_scores(score_mod: ScoreMod | None, scores: torch.Tensor, indices) -> torch.Tensor:
    """`scores` (B, H, N, M), a whole call's or a tile's, through `score_mod` (None: as they
    are), the result checked (`checked_result`), in their dtype."""
    if score_mod is None:
        return scores
    modded = score_mod(scores, *indices)
    modded = checked_result("score_mod", score_mod, modded, scores.shape, scores.dtype)
    return modded.to(scores.dtype)


def check_mod(name: str, mod: object) -> None:
    if mod is not None and not callable(mod):
        raise ValueError(
            f"{name} must be a function ({name}(...) -> tensor) or None, got {type(mod).__name__}"
        )


def is_pure(mod: Callable | None) -> bool:
    """Whether `mod` gives the same result on every call (its `pure` declaration, default True)."""
    return mod is None or getattr(mod, "pure", True)


def captured_tensors(mod: Callable | None) -> list[torch.Tensor]:
    """The tensors `mod` reads besides its arguments: those in its closure and its default
    arguments (through the functions, containers, modules and objects there: a wrapped mod's,
    a functools.partial's arguments, an object's attributes), the tensors and modules named by
    its code among its globals (and their attributes), what the user's global helper functions,
    classes and modules it names read (a library's are not followed), a callable instance's
    attributes and
    what its class's ``__call__`` reads, and those it declares (`mod.parameters`). Objects are
    followed `MAX_DEPTH` steps deep, each once. A callable whose code is not Python (nothing
    to read its tensors from) and that declares no `parameters` is taken as reading one that
    requires grad: `UNINSPECTED`, so that a call with it goes where a captured tensor gets its
    gradient (``mod_grad``: naive)."""
    found = {} if mod is None else {id(t): t for t in _tensors_in(mod, set(), True, MAX_DEPTH)}
    return list(found.values())  # each once, in the order found


def reads_learnable(
    score_mod: ScoreMod, batch: int, heads: int, dtype: torch.dtype, device
) -> bool:
    """Whether `score_mod` reads a tensor that requires grad, seen by calling it: on a
    (batch, heads, 1, 1) score that requires none, at position (0, 0), its result needs a
    gradient. Catches what `captured_tensors` cannot follow (a tensor deep in containers, a
    class attribute read through an instance); a mod the probe makes fail is left to its
    real call (False). Only for a pure mod: an impure one's calls are counted."""
    score = torch.zeros(batch, heads, 1, 1, dtype=dtype, device=device)
    try:
        with torch.enable_grad():
            out = score_mod(score, *mod_indices(batch, heads, (0, 1), (0, 1), device))
    except Exception:  # noqa: BLE001  (the real call raises it, checked, where it is made)
        return False
    return isinstance(out, torch.Tensor) and out.requires_grad


MAX_DEPTH = 8  # steps from the mod (a closure cell, an argument, an item, an attribute)
GLOBAL_DEPTH = 2  # steps from a global the mod's code names (HOLDER.settings.bias: 2)

# What `captured_tensors` finds in a callable it cannot read: a tensor requiring grad, so the
# call is a ``mod_grad`` one (declare `mod.parameters` to say what it reads instead)
UNINSPECTED = torch.empty(0, requires_grad=True)

_SCALARS = frozenset({str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device})
# Classes, modules and C functions and methods not bound to an object: no tensors of the mod's
_STATELESS = (
    type,
    types.ModuleType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)


def _tensors_in(
    value: object, seen: set[int], closure: bool = True, depth: int = MAX_DEPTH
) -> Iterator[torch.Tensor]:
    """Tensors inside `value`; `closure` False (a global): not through functions."""
    if type(value) in _SCALARS or id(value) in seen or depth < 0:
        return
    seen.add(id(value))
    inner = depth - 1
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, nn.Module):
        yield from value.parameters()
        if inner < 0:
            return
        yield from _each(_attributes(value), seen, closure, inner)  # its plain attributes
        if closure:  # the mod itself, or in its closure: what its forward reads
            yield from _tensors_in(getattr(type(value), "forward", None), seen, True, inner)
    elif inner < 0:
        return  # at the bound: only tensors and modules' parameters
    elif isinstance(value, list | tuple | set | frozenset | dict):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _tensors_in(item, seen, closure, inner)
    elif isinstance(value, _STATELESS):
        return
    elif inspect.ismethod(value) or isinstance(
        value, types.BuiltinMethodType | types.MethodWrapperType
    ):
        yield from _tensors_in(getattr(value, "__self__", None), seen, closure, inner)
        if closure:  # a Python method's function (a C function has no Python code to read)
            yield from _tensors_in(getattr(value, "__func__", None), seen, True, inner)
    elif isinstance(value, staticmethod | classmethod):
        yield from _tensors_in(value.__func__, seen, closure, depth)
    elif inspect.isfunction(value):
        if not closure and not _user_code(value):
            return  # a library's global function: not followed
        declared = getattr(value, "parameters", ())
        cells = [c.cell_contents for c in value.__closure__ or () if _filled(c)]
        defaults = [*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]
        yield from _each([declared, *cells, *defaults, *_attributes(value)], seen, True, inner)
        code, namespace = value.__code__, value.__globals__
        named = [namespace[n] for n in code.co_names if n in namespace]
        members = [m for g in named for m in _members(g, code.co_names)]
        yield from _each([*named, *members], seen, False, min(inner, GLOBAL_DEPTH))
    elif isinstance(value, functools.partial):
        parts = [value.func, *value.args, *value.keywords.values(), *_attributes(value)]
        yield from _each(parts, seen, closure, inner)
    elif closure and callable(value):  # a callable instance: its attributes, what __call__ reads
        declared = getattr(value, "parameters", None)
        wrapped = getattr(value, "__wrapped__", None)
        yield from _each([declared, wrapped, *_attributes(value)], seen, True, inner)
        call = type(value).__call__
        if inspect.isfunction(call):
            yield from _tensors_in(call, seen, True, inner)
        elif declared is None and wrapped is None:
            yield UNINSPECTED  # its code is not Python: taken as reading a learnable tensor
    else:  # an object (a global one's attributes are read, not its functions)
        yield from _each(_attributes(value), seen, closure, inner)


def _user_code(value: object) -> bool:
    """Whether `value` (a function, class or module) is a user's Python code, not the standard
    library's or an installed package's (whose tensors are not a mod's to capture): its file
    is outside Python's library folders (a script, a notebook cell, a plugin, this package
    when checked out)."""
    if isinstance(value, types.ModuleType):
        file = getattr(value, "__file__", None)
    elif isinstance(value, type):
        file = getattr(sys.modules.get(value.__module__), "__file__", None)
    else:
        file = value.__code__.co_filename
    if not file:
        return False  # a built-in module or class: no Python code
    return file.startswith("<") or not os.path.realpath(file).startswith(_LIBRARY_FOLDERS)


_LIBRARY_FOLDERS = tuple(
    os.path.realpath(folder) + os.sep
    for folder in {
        *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
        *site.getsitepackages(),
        site.getusersitepackages(),
    }
)


def _members(holder: object, names: tuple[str, ...]) -> list[object]:
    """What code naming `names` may read of a global user class or module: the module's
    attributes it names (SETTINGS.bias), the class's own and inherited attributes (Cls.bias,
    and what Cls.method() reads through `cls`). Nothing of a library's or of other objects."""
    if isinstance(holder, types.ModuleType) and _user_code(holder):
        return [vars(holder)[n] for n in names if n in vars(holder)]
    if isinstance(holder, type) and _user_code(holder):
        return [v for c in holder.__mro__ for k, v in vars(c).items() if not k.startswith("__")]
    return []


def _each(values: list, seen: set[int], closure: bool, depth: int) -> Iterator[torch.Tensor]:
    """The tensors in each of `values`, a list made here (not marked seen: its id, freed, may
    be another's)."""
    for value in values:
        yield from _tensors_in(value, seen, closure, depth)


def _attributes(value: object) -> list[object]:
    """`value`'s instance attributes (its __dict__ and __slots__; a module's plain ones)."""
    try:
        found = dict(getattr(value, "__dict__", None) or {})
    except Exception:  # noqa: BLE001  (a proxy's __getattr__ may raise anything)
        return []
    if isinstance(value, nn.Module):
        found = {k: v for k, v in found.items() if not k.startswith("_")}
    for name in _slots(type(value)):
        if hasattr(value, name):
            found.setdefault(name, getattr(value, name))
    return list(found.values())


@functools.cache
def _slots(cls: type) -> tuple[str, ...]:
    """The instance attributes `cls` declares in __slots__ (its bases' too)."""
    names = []
    for base in cls.__mro__:
        slots = base.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else slots
    return tuple(n for n in names if n not in ("__dict__", "__weakref__"))


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (a free variable not yet assigned raises)
    except ValueError:
        return False
    return True


KEY_DEPTH = 8  # steps from the mod (a closure cell, an item, a global) that a key follows
KEY_ELEMENTS = 4096  # the largest tensor a mod reads that is keyed (by its bytes): a mod reading a
# larger one has no key (blocks.py derives its block mask at every call)
# Libraries whose functions, classes and modules a mod may name (torch.where, this library's
# checked_result): keyed by name, taken as unchanging (a function defined inside another, a
# closure, is keyed by what it reads)
STABLE_MODULES = frozenset(
    {"attn_zoo", "builtins", "torch", "math", "operator", "functools", "itertools", "einops"}
)
_KEY_SCALARS = tuple(_SCALARS)  # by isinstance: a subclass's value (an IntEnum's) keyed too


class _Unkeyable(Exception):
    """A value a mod reads that `mod_key` cannot key."""


def mod_key(mod: object, tensors: list[torch.Tensor]) -> tuple | None:
    """A hashable key equal for two mods only if they compute the same values: a function's
    code with the keys of what it reads (closure, defaults, attributes, the globals its code
    names), a partial's function and arguments, values by value (containers item by item;
    floats and complex numbers by their bits: 0.0 and -0.0 differ, a NaN equals a NaN of the
    same bits), a tensor of at most `KEY_ELEMENTS` elements by its dtype, shape and bytes
    (appended to `tensors`; a larger one cannot be keyed), the functions, classes and modules of
    `STABLE_MODULES` by name; None if anything else is read (a callable instance, an object,
    a bound method, a module of another library), or it is deeper than `KEY_DEPTH`."""
    try:
        return _key(mod, tensors, set(), KEY_DEPTH)
    except _Unkeyable:
        return None


def _key(value: object, tensors: list[torch.Tensor], path: set[int], depth: int) -> object:
    """`value`'s key; `path`: the ids of the containers and functions it was reached through
    (a cycle back to one cannot be keyed)."""
    if isinstance(value, float | complex):  # by bits: by value 0.0 == -0.0, nan != nan
        return (type(value).__name__, struct.pack("<dd", value.real, value.imag))
    if isinstance(value, _KEY_SCALARS):
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


TILE = 256  # the widest tile of queries or keys a backend gives a mod (chunked.py: BLOCK, by
# which blocks.py tiles queries too; flex: 128)
# The most queries and keys `check_pointwise` evaluates a mod on: more than two tiles, so that a
# tile never holds every query or key of the whole (a top-k mod along either axis, with k up to
# TILE, keeps others on a tile than on the whole)
PROBE = 2 * TILE + 1
PROBE_BATCH = 2  # the most batch entries it evaluates it on (every head: a mod may check them)
# The (queries, keys) it tries, in order, under torch.compile (where a call's sizes may be unknown)
TRACED_PROBES = ((PROBE, PROBE), (64, 64), (8, 8))
# The spreads of the probe's score rows, in turn (standard normal times each; the last kind's
# rows also hold one `DOMINANT` score): a reduction that bites only on scores spread wider than
# N(0, 1) (keys more than 8 below the row's max) sees other maxima on a tile than on the whole
SCORE_SCALES = (1.0, 3.0, 10.0, 30.0, 1.0)
DOMINANT = 30.0  # one strong match among weak ones (a long context's)
CACHE_SIZE = 64  # entries of the caches keyed by `mod_key` (here, blocks.py)
POINTWISE = (
    "a mod's value at (b, h, i, j) must depend only on score[b, h, i, j], the indices b, h, i, "
    "j and the tensors it reads (elementwise, as FlexAttention requires): the kernels call it "
    "on the whole (N, M) or on tiles of any shape, so it must not read the index tensors' "
    "shapes nor reduce over the scores or positions it is given (top-k, a softmax, a cumsum)"
)

# (kind, mod_key, the probe's (b, H, n, m), dtype, device) of each mod found pointwise (a key
# names the mod by content, not by identity: a mod that has none is not cached)
_POINTWISE: OrderedDict[tuple, None] = OrderedDict()


def check_pointwise(
    kind: str, mod: Callable | None, shape: tuple[int, ...], dtype: torch.dtype | None, device
) -> None:
    """ValueError naming `mod` (`kind`: "score_mod" or "mask_mod"), the difference and
    `POINTWISE` unless the mod is pointwise: on a drawn (b, H, n, m) problem (`shape`: the
    call's (B, H, N, M), b = min(B, PROBE_BATCH), n = min(N, PROBE), m = min(M, PROBE);
    scores of `dtype`, a score mod's, `probe_scores`), each tile of `probe_tiles` gives the
    values the whole gives there (score mods to within 256 eps of `dtype`, infinities and NaN
    exactly), and the whole gives the same values when called again (else the mod is impure
    without declaring it: ValueError saying to declare ``pure = False``). Where the whole
    raises on that problem (a mod reading B, N or M through a tensor's shape,
    ``temps.view(B, 1, 1, 1)``), the probe runs on (B, H, n, m), then on the call's own
    (B, H, N, M) (costly: every score of the call, as naive computes them); where that raises
    too, its error is raised, on every backend (naive's call raises it; chunked's tiles might
    not: a mod adding a captured 256-long table by the tile's shape). A pass is
    cached (`CACHE_SIZE` entries) under the mod's `mod_key` and the probe's shape: once per
    mod and shape (every N and M from PROBE on alike); a mod without a key (reading an
    object's attribute, which may change) is probed at every call. Skipped for a mod declaring
    itself impure (its results vary by call). Under torch.compile the probe runs once,
    eagerly, when Dynamo traces the call, on a (1, 1, PROBE, PROBE) problem (the call's sizes
    may be traced as dynamic, unknown then; the kernels tile queries and keys only), or smaller
    ones (`TRACED_PROBES`) where the whole raises there; where it raises on every one, the
    mod is accepted only if it passed an eager probe before (by `mod_key`), else ValueError
    saying to call it once eagerly first. Not seen: a mod whose tiles differ from its whole
    only beyond PROBE queries or keys (a top-k along either axis with k >= PROBE)."""
    if mod is None or not is_pure(mod):
        return
    if torch.compiler.is_compiling():
        _traced_probe(kind, mod, dtype, str(torch.device(device)))
        return
    b, h, n, m = shape
    if n and m:
        capped = (min(n, PROBE), min(m, PROBE))
        tries = dict.fromkeys([(min(b, PROBE_BATCH), h, *capped), (b, h, *capped), (b, h, n, m)])
        for probe in tries:  # the first on which the whole does not raise is checked
            raised = _probe(kind, mod, probe, dtype, device)
            if raised is None:
                return
        raise raised  # on the call's own shape: naive's call would; chunked's tiles may not


@constant_when_compiled
def _traced_probe(kind: str, mod: Callable, dtype: torch.dtype | None, device: str) -> bool:
    """`_probe` on the first of `TRACED_PROBES` on which the mod's whole call does not raise,
    called by Dynamo when it traces a call (its result a constant of the graph); where it
    raises on every one, True only if the mod passed an eager probe before, else ValueError:
    never served unchecked."""
    raised = []
    for n, m in TRACED_PROBES:
        raised.append(_probe(kind, mod, (1, 1, n, m), dtype, device))
        if raised[-1] is None:
            return True
    content = mod_key(mod, [])
    if content is not None and any(key[:2] == (kind, content) for key in _POINTWISE):
        return True
    (n, m), first = TRACED_PROBES[0], raised[0]
    raise ValueError(
        f"{kind} {mod_name(mod)} could not be checked pointwise when torch.compile traced the "
        f"call: its whole call raised on every probe (1 batch entry and 1 head, the call's "
        f"sizes may be unknown then; queries x keys {TRACED_PROBES}; on {n} x {m}: "
        f"{type(first).__name__}: {first}) and it has not passed an eager check; call it once "
        f"eagerly first (e.g. one forward before torch.compile), where it is checked on the "
        f"call's own sizes"
    )


def probe_scores(b: int, h: int, n: int, m: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The (b, h, n, m) scores `check_pointwise` gives a score mod, in `dtype` on `device` (an
    expanded view: the same (n, m) in every batch entry and head; the kernels tile queries and
    keys only): drawn on the CPU from a fixed seed (the same on every device), standard normal,
    query row i times SCORE_SCALES[i % 5] (1, 3, 10, 30, 1), the last kind's rows with one
    score DOMINANT at key 37 i mod m (spread over the keys)."""
    scores = torch.randn(n, m, generator=torch.Generator().manual_seed(0), dtype=dtype)
    rows = torch.arange(n)
    kind = rows % len(SCORE_SCALES)
    scores *= torch.tensor(SCORE_SCALES, dtype=dtype)[kind].view(n, 1)
    strong = rows[kind == len(SCORE_SCALES) - 1]
    scores[strong, strong * 37 % m] = DOMINANT
    return scores.to(device).expand(b, h, n, m)


def _probe(kind: str, mod: Callable, probe: tuple[int, ...], dtype, device) -> Exception | None:
    """`check_pointwise` on the (b, H, n, m) problem `probe`: what the mod's whole call raised
    (nothing checked), else None."""
    b, h, n, m = probe
    content = mod_key(mod, [])
    key = (kind, content, b, h, n, m, dtype, str(torch.device(device)))
    if content is not None and key in _POINTWISE:
        _POINTWISE.move_to_end(key)
        return None
    if kind == "score_mod":
        scores = probe_scores(b, h, n, m, dtype, device)

    def tile(q: tuple[int, int], k: tuple[int, int]) -> torch.Tensor:  # (B, H, bq, bk)
        indices = mod_indices(b, h, q, k, device)
        if kind == "mask_mod":
            result = apply_mask_mod(mod, indices)
        else:  # a copy: a mod may change its score in place
            given = scores[..., q[0] : q[1], k[0] : k[1]].clone()
            result = modded_scores(mod, given, indices)
        return result.expand(b, h, q[1] - q[0], k[1] - k[0])

    with torch.no_grad():
        try:
            whole, again = tile((0, n), (0, m)), tile((0, n), (0, m))
        except Exception as err:  # noqa: BLE001  (the real call raises it, checked, where made)
            return err
        differs = _differences(again, whole)
        if differs:
            raise ValueError(
                f"{kind} {mod_name(mod)} is impure without declaring it: called twice with the "
                f"same arguments on a (B, H, N, M) = {(b, h, n, m)} problem it gave other values "
                f"({differs}); a mod whose results vary by call (random, stateful) must declare "
                f"it ({mod_name(mod)}.pure = False: mods.py), else the kernels calling it per "
                f"tile and again in backward give other attention than one call would"
            )
        for q, k in probe_tiles(n, m):
            where = f"queries {q[0]}..{q[1] - 1} and keys {k[0]}..{k[1] - 1}"
            try:
                part = tile(q, k)
            except Exception as err:
                raise ValueError(
                    f"{kind} {mod_name(mod)} is not pointwise: on the {where} of a (B, H, N, M) "
                    f"= {(b, h, n, m)} problem it raised {type(err).__name__}: {err}, on the "
                    f"whole it did not: {POINTWISE}"
                ) from err
            differs = _differences(part, whole[..., q[0] : q[1], k[0] : k[1]])
            if differs:
                raise ValueError(
                    f"{kind} {mod_name(mod)} is not pointwise: on the {where} of a (B, H, N, M) "
                    f"= {(b, h, n, m)} problem it gave other values than on the whole there "
                    f"({differs}): {POINTWISE}"
                )
    if content is not None:
        _POINTWISE[key] = None
        if len(_POINTWISE) > CACHE_SIZE:
            _POINTWISE.popitem(last=False)
    return None


def probe_tiles(n: int, m: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (queries, keys) ranges `check_pointwise` compares with the whole [0, n) x [0, m):
    each axis cut where the kernels cut it (every `TILE`: chunked's tiles, blocks.py's query
    tiles) or, up to one tile, the queries every n // 3 and the keys at 2 m // 3 (tiles of
    several shapes, none the whole's), and the last query with the last key (1 x 1)."""
    rows = _ranges(n, TILE if n > TILE else n // 3)
    columns = _ranges(m, TILE if m > TILE else 2 * m // 3)
    return [*itertools.product(rows, columns), ((n - 1, n), (m - 1, m))]


def _ranges(size: int, width: int) -> list[tuple[int, int]]:
    """[0, size) cut every `width`, or whole where `width` is 0."""
    if not width:
        return [(0, size)]
    return [(start, min(start + width, size)) for start in range(0, size, width)]


def _differences(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """How the tile's mod values `got` differ from the whole's `want` (boolean: exactly; float:
    beyond 256 eps of their dtype, relative and absolute, where both are finite; an infinity
    or NaN exactly: a masked score, -inf, is not within any tolerance of a kept one), or None."""
    if torch.equal(got, want):  # the same bits (the usual case): one pass
        return None
    if got.dtype == torch.bool:
        differ = got != want
        return f"{int(differ.sum())} of {differ.numel()} positions differ" if differ.any() else None
    gap = torch.where(got == want, 0.0, (got - want).abs())  # equal infinities: none
    tolerance = 256 * torch.finfo(want.dtype).eps
    close = gap <= tolerance * (1 + want.abs())
    same = (got == want) | (got.isnan() & want.isnan())
    differ = ~torch.where(got.isfinite() & want.isfinite(), close, same)
    if not differ.any():
        return None
    largest = gap[differ].nan_to_num(nan=float("inf")).max()
    return f"{int(differ.sum())} of {differ.numel()} values differ, by up to {float(largest):.3g}"


def build_mod(spec: object) -> Callable | None:
    """A mod from a name (``"causal"``: one whose arguments all have defaults), a table naming
    one with its arguments (``{"name": "sliding_window", "window": 64}``), or a function (as
    is); None stays None. A missing argument is a ValueError naming the table form."""
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if isinstance(spec, dict) and isinstance(spec.get("name"), str):
        kwargs = {k: v for k, v in spec.items() if k != "name"}
        parameters = inspect.signature(MODS[spec["name"]]).parameters.values()
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        missing = [
            p.name
            for p in parameters
            if p.kind in named and p.default is p.empty and p.name not in kwargs
        ]
        if missing:
            table = ", ".join([f'name = "{spec["name"]}"', *(f"{m} = ..." for m in missing)])
            raise ValueError(
                f"mod {spec['name']!r} needs {', '.join(missing)}: name it in a table {{ {table} }}"
            )
        return MODS.build(spec["name"], **kwargs)
    raise ValueError(
        f"a mod is a name ({', '.join(MODS.names())}), a table {{ name = ..., ... }} or a "
        f"function; got {spec!r}"
    )


def and_masks(*mods: MaskMod) -> MaskMod:
    """A mask mod allowing key j to query i where every one of `mods` does (a logical and;
    FlexAttention's and_masks): ``and_masks(document(lengths), causal())`` packs documents
    into a causal LM. Pure (`relative`) if every mod is; a causal mask itself
    (`replaces_causal`) if any mod is (``and_masks(prefix_lm(p), document(lengths))``: each
    document's prefix sees itself both ways)."""
    combined = _combined("and_masks", torch.logical_and, mods)
    combined.replaces_causal = any(getattr(mod, "replaces_causal", False) for mod in mods)
    return combined


def or_masks(*mods: MaskMod) -> MaskMod:
    """A mask mod allowing key j to query i where any of `mods` does (a logical or):
    ``or_masks(sliding_window(w), sink)``, sink(b, h, q_idx, kv_idx) = kv_idx < 4, a window
    that also sees the first 4 keys. Pure (`relative`) if every mod is; a causal mask itself
    (`replaces_causal`) if any mod is: a causal layer then applies the union as it is, not
    the union cut by causality."""
    combined = _combined("or_masks", torch.logical_or, mods)
    combined.replaces_causal = any(getattr(mod, "replaces_causal", False) for mod in mods)
    return combined


def not_mask(mod: MaskMod) -> MaskMod:
    """A mask mod allowing exactly the (query, key) pairs `mod` does not. Pure (`relative`) if
    `mod` is; never a causal mask itself (the complement of prefix_lm is no causal mask), so a
    causal layer cuts it by causality."""
    _check_mask_mods("not_mask", (mod,))

    def inverted_mask(b, h, q_idx, kv_idx):
        return ~checked_result("mask_mod", mod, mod(b, h, q_idx, kv_idx))

    inverted_mask.__name__, inverted_mask.pure = f"not_mask({mod_name(mod)})", is_pure(mod)
    inverted_mask.relative = getattr(mod, "relative", False)
    return inverted_mask


def _combined(name: str, op: Callable, mods: tuple[MaskMod, ...]) -> MaskMod:
    """The mask mod reducing the (type-checked) results of `mods` with `op`."""
    _check_mask_mods(name, mods)

    def combined_mask(b, h, q_idx, kv_idx):
        results = (checked_result("mask_mod", mod, mod(b, h, q_idx, kv_idx)) for mod in mods)
        return functools.reduce(op, results)

    combined_mask.__name__ = f"{name}({', '.join(mod_name(mod) for mod in mods)})"
    combined_mask.pure = all(is_pure(mod) for mod in mods)
    combined_mask.relative = all(getattr(mod, "relative", False) for mod in mods)
    return combined_mask


def _check_mask_mods(name: str, mods: tuple) -> None:
    if not mods:
        raise ValueError(f"{name}() needs one or more mask mods, got none")
    for i, mod in enumerate(mods):
        if not callable(mod):
            raise ValueError(
                f"{name}: argument {i} is {type(mod).__name__} {mod!r}: must be a mask mod, "
                "mask_mod(b, h, q_idx, kv_idx) -> boolean tensor"
            )


def shift_queries(mod: Callable | None, offset: int, score: bool) -> Callable | None:
    """`mod` seeing query i as position i + `offset`: the new queries of a cached decoding
    step are the last positions of the keys (offset = M - N). Its declarations carry over."""
    if mod is None or offset == 0:
        return mod
    if score:

        def shifted_score(score, b, h, q_idx, kv_idx):
            return mod(score, b, h, q_idx + offset, kv_idx)

        shifted = shifted_score
    else:

        def shifted_mask(b, h, q_idx, kv_idx):
            return mod(b, h, q_idx + offset, kv_idx)

        shifted = shifted_mask
    shifted.__name__, shifted.pure = mod_name(mod), is_pure(mod)  # for messages, dispatch
    return shifted


# Positions are int64 tensors: an int setting compared with them must fit one
_INT64_MAX = torch.iinfo(torch.int64).max


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a positive int")
    if value > _INT64_MAX:
        raise ValueError(
            f"{name}={value!r}: must be a positive int <= 2**63 - 1 (positions are int64)"
        )


@MODS.register("causal")
def causal() -> MaskMod:
    """Key j visible to query i iff j <= i (top-left causality as a mask_mod)."""

    def causal_mask(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    causal_mask.relative = True
    return causal_mask


@MODS.register("sliding_window")
def sliding_window(window: int, causal: bool = True) -> MaskMod:
    """Query i sees the `window` keys i - window + 1 .. i (causal) or |i - j| < window."""
    _positive("window", window)
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r}: must be true or false (a bool)")

    def sliding_window_mask(b, h, q_idx, kv_idx):
        near = (q_idx - kv_idx).abs() < window
        return near & (kv_idx <= q_idx) if causal else near

    sliding_window_mask.relative = True
    return sliding_window_mask


@MODS.register("prefix_lm")
def prefix_lm(prefix: int) -> MaskMod:
    """The first `prefix` keys visible to every query, causal after them (a prefix LM). It is a
    causal mask itself (`replaces_causal`): in a causal layer it replaces is_causal, so the
    prefix sees itself both ways."""
    _positive("prefix", prefix)

    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (kv_idx <= q_idx)

    prefix_lm_mask.replaces_causal = True  # a causal layer applies it instead of is_causal
    return prefix_lm_mask


@MODS.register("document")
def document(lengths: list[int]) -> MaskMod:
    """Packed documents of `lengths` tokens, in order (positions past their sum: one more
    document): a query sees only keys of its own document. For a packed causal LM, combine
    it with causality: is_causal=True, or ``and_masks(document(lengths), causal())``."""
    if not isinstance(lengths, list | tuple) or not lengths:
        raise ValueError(f"lengths={lengths!r}: must be a non-empty list of positive ints")
    for i, length in enumerate(lengths):
        _positive(f"lengths[{i}]", length)
    ends = list(itertools.accumulate(lengths))
    if ends[-1] > _INT64_MAX:
        raise ValueError(f"lengths={lengths!r}: their sum must be at most 2**63 - 1 (int64)")

    def document_id(position: torch.Tensor) -> torch.Tensor:  # how many documents end <= it
        # a binary search, O(log documents) per position (a sum of one comparison per document
        # made a tile's mask O(N / length) per entry: quadratic in N); the ends made a tensor
        # here, on the positions' device, so that the mod captures none (its key stays its
        # lengths, and FlexAttention's mask builder runs it on any device)
        bounds = torch.tensor(ends, dtype=torch.long, device=position.device)
        return torch.searchsorted(bounds, position.long(), right=True)

    def document_mask(b, h, q_idx, kv_idx):
        return document_id(q_idx) == document_id(kv_idx)

    return document_mask


@MODS.register("alibi")
def alibi(n_heads: int, symmetric: bool = False) -> ScoreMod:
    """ALiBi (Press et al. 2022): score - slope_h (i - j), for causal attention only (elsewhere
    it rewards the later keys j > i: `causal_only`); symmetric: score - slope_h |i - j|, the
    same under causality, for either direction. Slopes as the authors' code (BLOOM, Megatron):
    P = the largest power of two <= H; heads 0..P-1 take 2^(-8 h' / P), h' = 1..P, and heads
    P..H-1 every other slope of 2P heads, 2^(-4 (2 t + 1) / P), t = 0..H-P-1; in the score's
    dtype."""
    _positive("n_heads", n_heads)
    if not isinstance(symmetric, bool):
        raise ValueError(f"symmetric={symmetric!r}: must be true or false (a bool)")
    p = 2 ** (n_heads.bit_length() - 1)

    def alibi_bias(score, b, h, q_idx, kv_idx):  # the slope computed, not looked up: flex-safe
        if h.dim() == 4 and h.shape[1] != n_heads:  # (flex calls it per element: 0-d indices)
            raise ValueError(
                f"alibi(n_heads={n_heads}) called on {h.shape[1]} heads: its slopes are those "
                f"of {n_heads} heads; build it with n_heads={h.shape[1]}"
            )
        exponent = torch.where(h < p, 8 * (h + 1), 4 * (2 * (h - p) + 1)).to(score.dtype) / -p
        distance = (q_idx - kv_idx).abs() if symmetric else q_idx - kv_idx
        return score - torch.exp2(exponent) * distance

    alibi_bias.relative = True
    if not symmetric:
        alibi_bias.causal_only = (
            "ALiBi's bias -slope (i - j) grows with the key j past the query i, so without "
            "causality later keys win; use is_causal=True, or the symmetric bias -slope |i - j|: "
            'score_mod = { name = "alibi", symmetric = true }'
        )
    return alibi_bias


# A cap is applied in float32 or wider (half inputs are computed in float32): within its range
_FLOAT32 = torch.finfo(torch.float32)


@MODS.register("softcap")
def softcap(cap: float) -> ScoreMod:
    """Logit softcapping (Gemma 2): cap * tanh(score / cap)."""
    number = isinstance(cap, int | float) and not isinstance(cap, bool)
    if not number or not _FLOAT32.tiny <= cap <= _FLOAT32.max:  # NaN fails too
        raise ValueError(
            f"cap={cap!r}: must be a positive float in [{_FLOAT32.tiny:.4g}, "
            f"{_FLOAT32.max:.4g}] (float32's normal range: the scores are float32 or wider)"
        )

    def softcap_score(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    softcap_score.relative = True  # reads no position
    return softcap_score
