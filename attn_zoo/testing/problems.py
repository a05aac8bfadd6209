"""Attention problems: a frozen description of one kernel call, turned into tensors on demand.

A problem is drawn by Hypothesis (`strategies.attention_problems`) and shrinks to a readable
repr; `inputs(dtype)` rebuilds the same tensors from its seed every time, new ones each call,
laid out in memory as its ``layout`` says (`LAYOUTS`: q, k, v and the mask alike; the values do
not depend on it). A `MechanismProblem` describes one call of a whole mechanism the same way
(`strategies.mechanism_problems`), its mask one of `MECHANISM_MASKS` (`mechanism_mask`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attn_zoo.kernels.dispatch import FLOAT_DTYPES
from attn_zoo.kernels.softmax.mods import MODS
from attn_zoo.mechanisms.base import check_int
from attn_zoo.registry import unknown_name_error

MASK_KINDS = ("none", "random", "key_padding", "empty_rows", "additive", "float32_min")
# A mechanism's masks (`mechanism_mask`): key padding and per query, boolean and additive float
MECHANISM_MASKS = ("padding", "per_query", "float_padding", "float_per_query")
CAUSAL = (False, True, "top_left", "bottom_right")
LAYOUTS = ("contiguous", "transposed", "strided")  # see `lay_out`
# The kit's own mods (mods.py), by name, with arguments small enough to matter at short
# lengths: a problem names one of these, or holds a user's function (a mod as mods.py says)
SCORE_MODS: dict[str, Callable[[AttentionProblem, str], Callable]] = {
    "alibi": lambda p, device: MODS.build("alibi", n_heads=p.heads),
    "softcap": lambda p, device: MODS.build("softcap", cap=1.5),
    "relative_bias": lambda p, device: relative_bias(p.heads, p.seed, device),
}
MASK_MODS: dict[str, Callable[[AttentionProblem, str], Callable]] = {
    "causal": lambda p, device: MODS.build("causal"),
    "sliding_window": lambda p, device: MODS.build("sliding_window", window=3),
    "window_both_sides": lambda p, device: MODS.build("sliding_window", window=2, causal=False),
    "prefix_lm": lambda p, device: MODS.build("prefix_lm", prefix=2),
    "document": lambda p, device: MODS.build("document", lengths=[3, 5, 2]),
}


def relative_bias(heads: int, seed: int, device: str = "cpu", reach: int = 4) -> Callable:
    """A score mod adding a learned-style relative-position bias, a tensor on `device` it
    captures, indexed by the head and the clipped offset: score + table[h, clip(i - j, -reach,
    reach) + reach]."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(heads, 2 * reach + 1, generator=gen).to(device)  # float32: flex's scores

    def relative_bias_score(score, b, h, q_idx, kv_idx):
        offset = (q_idx - kv_idx).clamp(-reach, reach) + reach
        return score + table[h, offset]

    return relative_bias_score


def resolve_mod(
    mod: str | Callable | None, kit: dict, problem: AttentionProblem, device: str = "cpu"
):
    """A problem's mod as a function: a kit name built for `problem` (its tensors on
    `device`), a function as it is."""
    if mod is None or callable(mod):
        return mod
    if mod not in kit:
        raise ValueError(f"mod={mod!r}: the kit's are {sorted(kit)} (or give a function)")
    return kit[mod](problem, device)


def make_mask(kind: str, b: int, h: int, n: int, m: int, gen: torch.Generator):
    """A mask of `kind` broadcastable to (b, h, n, m), or None for "none". "additive" is a
    float mask: values in [-2, 2] added to the scores, -inf where masked, some empty rows.
    "float32_min" is a float32 mask as transformers builds one: 0 where kept, float32's min
    (finite) where masked, about a third of the rows all min: such a row is no empty one, its
    output is the mean of its values (the min swamps every score); a call keeps it float32
    for half-precision inputs (`call_inputs`), where casting would make the min -inf."""
    if kind == "none":
        return None
    if kind == "float32_min":
        keep = make_mask("empty_rows", b, h, n, m, gen)
        return torch.zeros(b, h, n, m).masked_fill(~keep, torch.finfo(torch.float32).min)
    if kind == "additive":
        keep = torch.rand(b, h, n, m, generator=gen) < 0.7
        keep &= torch.rand(b, h, n, 1, generator=gen) < 0.8
        bias = 4 * torch.rand(b, h, n, m, generator=gen, dtype=torch.float64) - 2
        return bias.masked_fill(~keep, float("-inf"))
    if kind == "key_padding":  # (B, 1, 1, M): each sequence keeps a random prefix
        keep = torch.randint(0, m + 1, (b, 1, 1, 1), generator=gen)
        return torch.arange(m).view(1, 1, 1, m) < keep
    mask = torch.rand(b, h, n, m, generator=gen) < 0.7
    if kind == "empty_rows":  # about a third of the query rows see no key at all
        mask &= torch.rand(b, h, n, 1, generator=gen) < 0.67
    return mask


def check_mechanism_mask(kind: str, argument: str = "mask") -> None:
    """ValueError naming `argument` unless `kind` is "none" or one of `MECHANISM_MASKS`."""
    if kind not in ("none", *MECHANISM_MASKS):
        raise ValueError(f"{argument}={kind!r}: valid kinds are {('none', *MECHANISM_MASKS)}")


def mechanism_mask(kind: str, batch: int, length: int, gen: torch.Generator) -> torch.Tensor | None:
    """A mask of `kind` for a mechanism's call on x (batch, length, d_model), or None for
    "none". "padding": boolean (batch, 1, 1, length), each sequence keeping a random prefix of
    its keys, the first sequence fewer than all (none at length 1: its rows see no key; at
    length 0 every mask is empty); "per_query": boolean (batch, 1, length, length), random,
    about a third of the query rows seeing no key; "float_padding", "float_per_query": the
    same as additive float masks (float64, values in [-2, 2], -inf where masked)."""
    check_mechanism_mask(kind)
    if kind == "none":
        return None
    if kind.endswith("padding"):
        kept = torch.randint(0, length + 1, (batch, 1, 1, 1), generator=gen)
        kept[0] = torch.randint(0, max(length, 1), (), generator=gen)  # some key hidden
        keep = torch.arange(length).view(1, 1, 1, length) < kept
    else:
        keep = make_mask("empty_rows", batch, 1, length, length, gen)
    if not kind.startswith("float"):
        return keep
    bias = 4 * torch.rand(keep.shape, generator=gen, dtype=torch.float64) - 2
    return bias.masked_fill(~keep, float("-inf"))


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to `threads` (None: unchanged),
    restored after. Kernels can be wrong at one thread count only (the order of a parallel
    sum, a split of the work), so problems carry the count they run with."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_names(argument: str, names: Iterable[str], valid: Collection[str]) -> None:
    """ValueError naming `argument` and its first entry not in `valid`, with the closest valid
    one and all of them (`unknown_name_error`); a lone string (the argument takes several
    names) is refused too."""
    if isinstance(names, str):
        raise ValueError(f"{argument}={names!r}: give a collection of names, e.g. ({names!r},)")
    for name in names:
        if name not in valid:
            raise unknown_name_error(f"{argument} entry", name, valid)


def check_dtype(dtype: object) -> None:
    """ValueError unless `dtype` is a float dtype (those the kit has tolerances for)."""
    if dtype not in FLOAT_DTYPES:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in FLOAT_DTYPES))
        raise ValueError(f"dtype={dtype!r}: valid are {names}")


def check_fields(problem: AttentionProblem | RelationalProblem, widths: tuple[str, ...]) -> None:
    """ValueError naming the first invalid field of `problem`: batch, heads, kv_heads and the
    `widths` integers >= 1 (with none of one, every output is empty: any kernel would pass);
    q_len, k_len integers >= 0 (N = 0 queries, M = 0 keys: edge cases kernels meet, the other
    side's tensors still checked); heads a multiple of kv_heads; scale (and a rel_scale)
    None or a finite number; a float dtype; threads None or >= 1; mask, is_causal and layout
    among `MASK_KINDS`, `CAUSAL` and `LAYOUTS`."""
    for name in ("batch", "heads", "kv_heads", *widths):
        check_int(name, getattr(problem, name))
    for name in ("q_len", "k_len"):
        check_int(name, getattr(problem, name), low=0)
    check_int("threads", problem.threads, optional=True)
    for name in ("scale", "rel_scale"):
        value = getattr(problem, name, None)
        real = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (real and math.isfinite(value)):
            raise ValueError(f"{name}={value!r}: must be None or a finite number")
    check_dtype(problem.dtype)
    if problem.layout not in LAYOUTS:
        raise ValueError(f"layout={problem.layout!r}: valid layouts are {LAYOUTS}")
    if problem.mask not in MASK_KINDS:
        raise ValueError(f"mask={problem.mask!r}: valid kinds are {MASK_KINDS}")
    if problem.is_causal not in CAUSAL:
        raise ValueError(f"is_causal={problem.is_causal!r}: valid are {CAUSAL}")
    if problem.heads % problem.kv_heads:
        raise ValueError(f"heads={problem.heads} must be a multiple of kv_heads={problem.kv_heads}")


def check_mechanism_call(
    batch: object, length: object, dtype: object, any_length: bool = False
) -> None:
    """ValueError naming the first invalid one: `batch` an integer >= 1 (none: an empty
    output, any backend would pass), `length` one >= 0 (or None, if `any_length`: the kit's
    lengths), `dtype` a float dtype."""
    check_int("batch", batch)
    check_int("length", length, low=0, optional=any_length)
    check_dtype(dtype)


def every_other(t: torch.Tensor, between: float | bool) -> torch.Tensor:
    """`t` with the same values at every other element of a buffer twice as wide along its
    last dimension (stride 2 there; the elements between hold `between`)."""
    wide = t.new_full((*t.shape[:-1], 2 * t.shape[-1]), between)
    wide[..., ::2] = t
    return wide[..., ::2]


def lay_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """`t` (.., X, Y, d) with the same values, laid out in memory as `layout` says:
    "contiguous"; "transposed", a view of a contiguous (.., Y, X, d) tensor (for q (B, H, N, d):
    heads split off a (B, N, H d) projection, as models make them); "strided", `every_other`
    element along d (the elements between are NaN)."""
    if layout == "transposed":
        return t.transpose(-3, -2).contiguous().transpose(-3, -2)
    if layout == "strided":
        return every_other(t, float("nan"))
    return t


def lay_out_mask(mask: torch.Tensor, layout: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A mask (.., N, M) with the same values laid out as `layout` says (as `lay_out` lays out
    q, k, v): "contiguous"; "transposed", a view of a contiguous (.., M, N) tensor; "strided",
    `every_other` element along M (the elements between: True, or NaN in a float mask), its
    size-1 dimensions expanded to `shape` (B, H, N, M) with stride 0, as models pass a padding
    mask."""
    if layout == "transposed":
        return mask.transpose(-2, -1).contiguous().transpose(-2, -1)
    if layout == "strided":
        return every_other(mask, float("nan") if mask.is_floating_point() else True).expand(shape)
    return mask


def kernel_tensors(
    tensors: dict,
    mask: torch.Tensor | None,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    layout: str = "contiguous",
    frozen: Collection[str] = (),
) -> dict:
    """A problem's float64 `tensors` cast to `dtype` on `device`, laid out as `layout`
    (`lay_out`), as leaves requiring grad but those named in `frozen`; and its `mask` as
    ``attn_mask``: a float mask in `dtype` (a float32 one in the wider of float32 and
    `dtype`), on `device`, laid out as `layout` for a call of `shape` (B, H, N, M)
    (`lay_out_mask`), or None."""
    inputs = {
        k: lay_out(t.to(dtype).to(device), layout).requires_grad_(k not in frozen)
        for k, t in tensors.items()
    }
    if mask is not None:
        if mask.is_floating_point():
            wide = mask.dtype == torch.float32  # "float32_min": kept at least float32
            mask = mask.to(device, torch.promote_types(dtype, mask.dtype) if wide else dtype)
        else:
            mask = mask.to(device)
        mask = lay_out_mask(mask, layout, shape)
    inputs["attn_mask"] = mask
    return inputs


@dataclass(frozen=True)
class AttentionProblem:
    """q (batch, heads, q_len, key_dim), k (batch, kv_heads, k_len, key_dim),
    v (batch, kv_heads, k_len, value_dim), a mask of kind `mask` (see `MASK_KINDS`), causal
    alignment `is_causal` (False, True = "top_left", or "bottom_right"); `score_mod` and
    `mask_mod`: a mod of the kit (`SCORE_MODS`, `MASK_MODS`) by name, a function (mods.py's
    signatures), or None; `threads`: torch's thread count while the kit runs it (None: the
    process's); `frozen`: the inputs among q, k, v given without requires_grad (k and v of a
    frozen encoder; () = every one requires grad), whose gradients are then not compared."""

    batch: int = 1
    heads: int = 2
    kv_heads: int = 2
    q_len: int = 8
    k_len: int = 8
    key_dim: int = 4
    value_dim: int = 4
    mask: str = "none"
    is_causal: bool | str = False
    scale: float | None = None
    dtype: torch.dtype = torch.float32
    seed: int = 0
    threads: int | None = None
    score_mod: str | Callable | None = None
    mask_mod: str | Callable | None = None
    layout: str = "contiguous"
    frozen: tuple[str, ...] = ()

    def __post_init__(self):
        check_fields(self, ("key_dim", "value_dim"))
        check_names("frozen", self.frozen, ("q", "k", "v"))
        resolve_mod(self.score_mod, SCORE_MODS, self)
        resolve_mod(self.mask_mod, MASK_MODS, self)

    def attn_mask(self, gen: torch.Generator) -> torch.Tensor | None:
        return make_mask(self.mask, self.batch, self.heads, self.q_len, self.k_len, gen)

    def inputs(self, dtype: torch.dtype | None = None, device: str = "cpu") -> dict:
        """Kernel kwargs: q, k, v (new leaf tensors, requiring grad but those `frozen`, laid
        out as `layout`), attn_mask, is_causal, scale, and score_mod and mask_mod where the
        problem has them."""
        gen = torch.Generator().manual_seed(self.seed)
        shapes = {
            "q": (self.batch, self.heads, self.q_len, self.key_dim),
            "k": (self.batch, self.kv_heads, self.k_len, self.key_dim),
            "v": (self.batch, self.kv_heads, self.k_len, self.value_dim),
        }
        tensors = {
            name: torch.randn(s, generator=gen, dtype=torch.float64) for name, s in shapes.items()
        }
        shape = (self.batch, self.heads, self.q_len, self.k_len)
        dtype = self.dtype if dtype is None else dtype
        mask = self.attn_mask(gen)
        inputs = kernel_tensors(tensors, mask, shape, dtype, device, self.layout, self.frozen)
        inputs["is_causal"] = self.is_causal
        inputs["scale"] = self.scale
        for name, kit in (("score_mod", SCORE_MODS), ("mask_mod", MASK_MODS)):
            if (mod := getattr(self, name)) is not None:
                inputs[name] = resolve_mod(mod, kit, self, device)
        return inputs


def relational_tensors(max_rel_pos: int | None) -> tuple[str, ...]:
    """The tensor inputs of a `RelationalProblem`: q, k, qr, kr and v, or v_rel where it has a
    `max_rel_pos`."""
    return ("q", "k", "qr", "kr", "v" if max_rel_pos is None else "v_rel")


@dataclass(frozen=True)
class RelationalProblem:
    """Inputs of the relational kernel: attention q, k as in `AttentionProblem`, relations
    qr (batch, n_relations, q_len, rel_dim), kr (.., k_len, rel_dim), and symbol values v
    (batch, kv_heads, k_len, head_dim) or, if `max_rel_pos` is set, relative symbol values
    v_rel (kv_heads, 2 max_rel_pos + 1, head_dim); `threads`, `layout` (of every tensor, the
    mask included) and `frozen` (among those tensors, `relational_tensors`) as in
    `AttentionProblem`."""

    batch: int = 1
    heads: int = 2
    kv_heads: int = 2
    n_relations: int = 2
    q_len: int = 8
    k_len: int = 8
    key_dim: int = 4
    rel_dim: int = 4
    head_dim: int = 4
    max_rel_pos: int | None = None
    rel_activation: str = "identity"
    mask: str = "none"
    is_causal: bool | str = False
    scale: float | None = None
    rel_scale: float | None = None
    dtype: torch.dtype = torch.float32
    seed: int = 0
    threads: int | None = None
    layout: str = "contiguous"
    frozen: tuple[str, ...] = ()

    def __post_init__(self):
        check_fields(self, ("n_relations", "key_dim", "rel_dim", "head_dim"))
        check_int("max_rel_pos", self.max_rel_pos, low=0, optional=True)
        check_names("frozen", self.frozen, relational_tensors(self.max_rel_pos))

    def inputs(self, dtype: torch.dtype | None = None, device: str = "cpu") -> dict:
        gen = torch.Generator().manual_seed(self.seed)
        b, r = self.batch, self.n_relations
        shapes = {
            "q": (b, self.heads, self.q_len, self.key_dim),
            "k": (b, self.kv_heads, self.k_len, self.key_dim),
            "qr": (b, r, self.q_len, self.rel_dim),
            "kr": (b, r, self.k_len, self.rel_dim),
        }
        if self.max_rel_pos is None:
            shapes["v"] = (b, self.kv_heads, self.k_len, self.head_dim)
        else:
            shapes["v_rel"] = (self.kv_heads, 2 * self.max_rel_pos + 1, self.head_dim)
        tensors = {
            name: torch.randn(s, generator=gen, dtype=torch.float64) for name, s in shapes.items()
        }
        shape = (b, self.heads, self.q_len, self.k_len)
        mask = make_mask(self.mask, *shape, gen)
        dtype = self.dtype if dtype is None else dtype
        inputs = kernel_tensors(tensors, mask, shape, dtype, device, self.layout, self.frozen)
        inputs.update(
            is_causal=self.is_causal,
            scale=self.scale,
            rel_scale=self.rel_scale,
            rel_activation=self.rel_activation,
        )
        return inputs


@dataclass(frozen=True)
class MechanismProblem:
    """One call of a mechanism on x (batch, length, d_model), for
    `assert_mechanism_backends_agree`: a mask of kind `mask` ("none" or one of
    `MECHANISM_MASKS`: `mechanism_mask`), causal or not, in `dtype`, drawn from `seed`."""

    batch: int = 2
    length: int = 9
    mask: str = "none"
    is_causal: bool = False
    dtype: torch.dtype = torch.float32
    seed: int = 0

    def __post_init__(self):
        check_mechanism_call(self.batch, self.length, self.dtype)
        check_mechanism_mask(self.mask)

    def attn_mask(self) -> torch.Tensor | None:
        """The mask of the call, as the kit draws it (`mechanism_mask`, from `seed`)."""
        gen = torch.Generator().manual_seed(self.seed)
        return mechanism_mask(self.mask, self.batch, self.length, gen)

    def arguments(self) -> dict:
        """The problem as keyword arguments of the kit:
        ``assert_mechanism_backends_agree(name, kwargs, **problem.arguments())`` checks each
        backend on the call without a mask and with the problem's (skipped where the mechanism
        refuses it)."""
        return dict(
            batch=self.batch,
            length=self.length,
            masks=() if self.mask == "none" else (self.mask,),
            is_causal=self.is_causal,
            dtype=self.dtype,
            seed=self.seed,
        )
