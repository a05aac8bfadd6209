"""The mechanism contract: what every registered mechanism promises, checked for each mechanism
of `az.list_mechanisms()` and each of its backends (`az.list_backends`) that `az.backend_status`
says runs on CPU.

What a mechanism serves is read from what it declares: `causal_only`, `supports_cache`, an
`attention_maps` method, a `dropout` keyword, a `symbol_retriever`, a `rope` or `cache`
parameter of its forward, and the features its kernel families' naive backends declare
(``mask``, ``causal``). `SPECS` holds the rest: small valid kwargs per mechanism (the first the
plain one; the others exercise its options: grouped kv heads, a key width of its own, ...),
the input layout of the mechanisms whose input is not a (B, N, D) sequence, and the few
declarations the library does not expose. A new mechanism fails here until it has a row.

Float64 comparisons: the kit's (atol 1e-10, rtol 1e-8, outputs and the gradients of the input
and of every parameter); a property of one backend (causality, masks, cache, permutation)
atol 1e-12, rtol 0 (1e-6 in float32 on a backend without float64: relational cpp). Float32:
the kit's tolerances at every length where a kernel's tiling changes. A backend may refuse a
call by a capability it declares (UnsupportedCallError: a mask, an option, a dtype); the plain
float32 calls it may not refuse. Each mechanism's own file keeps what is its own: papers,
reference packages, its options and kernels."""

import dataclasses
import functools
import inspect
import re
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_zoo as az
from attn_zoo.kernels.dispatch import FAMILIES, UnsupportedCallError, family
from attn_zoo.kernels.rotary import Rotary, rotary_tables
from attn_zoo.maps import record_attention_maps, recording_attention
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.testing import assert_mechanism_backends_agree, lengths

DERIVED = "derived"  # a Spec field read from the mechanism's declarations
SYMBOLS = dict(  # symbols from each token alone: causal, cacheable, permutation-equivariant
    symbol_retrieval="symbolic_attention", symbol_retrieval_kwargs=dict(n_symbols=5, n_heads=2)
)
LAYOUTS = {  # the input's dims between the batch and d_model, for an attended length n
    "sequence": lambda n: (n,),
    "axial": lambda n: (n, 3),  # raster order: causal along every axis
    "msa": lambda n: (3, n),  # 3 aligned rows of n columns
}


@dataclasses.dataclass(frozen=True)
class Spec:
    """configs: kwargs, the first the plain one; layout: a key of LAYOUTS; masks ("attention"
    (B, H, N, N), "padding" (B, rows, cols), None: refused), causal and rope: declarations the
    library does not expose (DERIVED: from the kernel families; rope False: refused);
    ignores_symbols: its forward documents symbols as unused (ignored, not refused)."""

    configs: tuple[dict, ...]
    layout: str = "sequence"
    masks: str | None = DERIVED
    causal: bool | str = DERIVED
    rope: bool = True
    ignores_symbols: bool = False


SPECS = {
    "additive": Spec(
        (dict(d_model=12, n_heads=3), dict(d_model=4, n_heads=1, bias=False)), rope=False
    ),  # no query-key products for RoPE to rotate
    "axial": Spec(
        (dict(d_model=8, n_heads=2), dict(d_model=8, n_heads=2, head_dim=3, combine="sequential")),
        layout="axial",
        masks=None,  # is_causal masks every axis; no attn_mask
    ),
    "differential": Spec(
        (dict(d_model=16, n_heads=2), dict(d_model=16, n_heads=4, n_kv_heads=2, layer=3))
    ),
    "dual": Spec(
        (
            dict(d_model=16, n_heads_sa=2, n_heads_ra=2, **SYMBOLS),
            dict(d_model=12, n_heads_sa=1, n_heads_ra=2, ra_kwargs=dict(n_relations=3), **SYMBOLS),
            dict(d_model=16, n_heads_sa=2, n_heads_ra=2, share_attn_params=True, **SYMBOLS),
            dict(  # the branches summed, each as wide as d_model
                d_model=16,
                n_heads_sa=2,
                n_heads_ra=2,
                combine="sum",
                sa_kwargs=dict(n_kv_heads=1),
                **SYMBOLS,
            ),
        )
    ),
    "gla": Spec(
        (dict(d_model=8, n_heads=2), dict(d_model=8, n_heads=1, key_dim=5, gate_rank=3, tau=2.0)),
        rope=False,  # its decay gates carry the order
    ),
    "linear": Spec(
        (
            dict(d_model=12, n_heads=3),
            dict(d_model=4, n_heads=1),
            dict(d_model=8, n_heads=2, n_kv_heads=1, key_dim=3),
        ),
        rope=False,  # rotating phi(q), phi(k) would break the positive normaliser
    ),
    # an alignment has no causal order; its mask is a padding mask (B, rows, cols)
    "msa_column": Spec((dict(d_model=8, n_heads=2),), layout="msa", masks="padding", causal=False),
    "msa_row": Spec(
        (dict(d_model=8, n_heads=2), dict(d_model=8, n_heads=2, tied=True)),
        layout="msa",
        masks="padding",
        causal=False,
    ),
    "relational": Spec(
        (
            dict(d_model=16, n_heads=2, **SYMBOLS),
            dict(d_model=12, n_heads=3, n_kv_heads=1, n_relations=2, add_bias_kv=True, **SYMBOLS),
            dict(d_model=8, n_heads=2, rel_activation="tanh", symmetric_rels=True, **SYMBOLS),
        )
    ),
    "sigmoid": Spec(
        (dict(d_model=16, n_heads=2), dict(d_model=16, n_heads=4, n_kv_heads=2, bias=-1.0))
    ),
    "softcapped": Spec(
        (dict(d_model=16, n_heads=2, cap=1.0), dict(d_model=16, n_heads=4, n_kv_heads=2)),
        ignores_symbols=True,  # it is standard attention
    ),
    "standard": Spec(
        (
            dict(d_model=16, n_heads=4),
            dict(d_model=16, n_heads=4, n_kv_heads=2, key_dim=6, add_bias_kv=True),
            dict(d_model=12, n_heads=2, add_bias_out=True),
        ),
        ignores_symbols=True,  # forward: "unused: standard attention reads no symbols"
    ),
}


def available(name: str) -> list[str]:
    """The backends of `name` that backend_status says run on CPU."""
    return [b for b in az.list_backends(name) if az.backend_status(name, b, "cpu")[0]]


def build(name: str, config: dict, backend: str = "auto", dtype=torch.float64):
    torch.manual_seed(0)
    return az.build(name, backend=backend, **config).to(dtype).eval()


def kernel_families(module) -> set[str]:
    return {m.kernel_family for m in module.modules() if isinstance(m, az.AttentionMechanism)}


def declared(module, feature: str) -> bool:
    """Whether the naive backend of every kernel family the module calls declares `feature`."""
    features = [family(f).backends["naive"].capabilities.features for f in kernel_families(module)]
    return all(feature in f for f in features)


@dataclasses.dataclass(frozen=True)
class Serves:
    """What a mechanism serves, from its declarations (see the module docstring)."""

    masks: str | None
    causal: bool
    causal_only: bool
    symbols: bool
    rope: bool
    takes_rope: bool
    takes_cache: bool
    maps: bool
    dropout: bool


@functools.cache
def serves(name: str) -> Serves:
    s, module = SPECS[name], build(name, SPECS[name].configs[0])
    params = inspect.signature(module.forward).parameters
    masks = s.masks if s.masks != DERIVED else ("attention" if declared(module, "mask") else None)
    causal_only = type(module).causal_only
    return Serves(
        masks=masks,
        causal=s.causal if s.causal != DERIVED else causal_only or declared(module, "causal"),
        causal_only=causal_only,
        symbols=hasattr(module, "symbol_retriever"),
        rope="rope" in params and s.rope,
        takes_rope="rope" in params,
        takes_cache="cache" in params,
        maps=any(callable(getattr(m, "attention_maps", None)) for m in module.modules()),
        dropout="dropout" in az.mechanism_kwargs(name),
    )


def causal_modes(name: str) -> list[bool]:
    what = serves(name)
    return [True] if what.causal_only else [False, True] if what.causal else [False]


def input_shape(name: str, config: dict, n: int, batch: int = 2) -> tuple[int, ...]:
    return (batch, *LAYOUTS[SPECS[name].layout](n), config["d_model"])


def randn(shape, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def rope_for(module, n: int) -> Rotary:
    """RoPE tables for n positions, of the module's key width."""
    width = next(m.key_dim for m in module.modules() if hasattr(m, "key_dim"))
    return Rotary(*(t.double() for t in rotary_tables(width, n)))


def make_mask(kind: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """mask: per query (B, 1, N, N), batch 0's middle row sees no key; key_mask: padding
    (B, 1, 1, N), batch 0's first two keys hidden (with causality its first rows see none);
    float_mask: additive, values in [-2, 2], -inf where masked, an empty row; padding: an
    MSA's (B, rows, cols), True = real, batch 0's first row all padding."""
    gen = torch.Generator().manual_seed(seed)
    b, n = shape[0], shape[-2]
    if kind == "padding":
        keep = torch.rand(shape[:-1], generator=gen) < 0.7
        keep[0, 0] = False
        return keep
    if kind == "key_mask":
        keep = torch.ones(b, 1, 1, n, dtype=torch.bool)
        keep[0, ..., :2] = False
        return keep
    if kind == "mask":
        keep = torch.rand(b, 1, n, n, generator=gen) < 0.6
        keep[0, 0, n // 2] = False
        return keep
    bias = 4 * torch.rand(b, 1, n, n, generator=gen, dtype=torch.float64) - 2
    hidden = torch.rand(b, 1, n, n, generator=gen) < 0.3
    hidden[0, 0, n // 2] = True
    return bias.masked_fill(hidden, float("-inf"))


def calls(name: str) -> list[tuple[str, bool]]:
    """(mask kind, is_causal) of every call the mechanism serves that the agreement covers."""
    what = serves(name)
    plain = [("none", c) for c in causal_modes(name)]
    if what.masks == "padding":
        return [*plain, ("padding", False)]
    if what.masks == "attention":
        return [*plain, ("mask", False), ("key_mask", True), ("float_mask", False),
                ("float_mask", True)]  # fmt: skip
    return plain


MECHANISMS = [m for m in az.list_mechanisms() if m in SPECS]  # the rest fail the test below


def where(test) -> list[tuple[str, str]]:
    """(mechanism, backend) of every mechanism for which `test(name)` holds and each backend
    available on CPU."""
    return [(m, b) for m in MECHANISMS if test(m) for b in available(m)]


def dtype_for(name: str, backend: str) -> torch.dtype:
    """float64, or float32 where the backend's kernels declare no float64 (relational cpp)."""
    module = build(name, SPECS[name].configs[0])
    for fam in map(family, kernel_families(module)):
        names = [backend] if backend in fam.backends else [
            b.name for b in fam.backends.values() if backend in ("auto", b.tier)
        ]  # fmt: skip
        if not any(torch.float64 in fam.backends[b].capabilities.dtypes for b in names):
            return torch.float32
    return torch.float64


TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}  # atol of one backend's properties


DECLARED = re.compile(r"does not support|not supported \(supports")  # a capability's refusal


@contextmanager
def refused_by_declaration(plain: bool):
    """Run the block; unless `plain` (the first config), a backend's refusal by a capability it
    declares (UnsupportedCallError: an option it does not serve) ends the block quietly."""
    try:
        yield
    except UnsupportedCallError as err:
        if plain or not DECLARED.search(str(err)):
            raise


def check_report(name: str, report: dict, every: bool) -> None:
    """Every available backend agreed ("ok"), or, unless `every`, refused by a capability it
    declares (a feature of the call or the dtype); naive always agrees."""
    assert report["naive"] == "ok", report
    for backend in available(name):
        status = report[backend]
        if status.startswith("ok"):
            continue
        assert not every and DECLARED.search(status), f"{name} backend {backend!r}: {status}"


def test_every_mechanism_has_a_spec():
    """A registered mechanism without a row in SPECS would go unchecked."""
    assert set(SPECS) == set(az.list_mechanisms())


@pytest.mark.parametrize(
    "name, backend", [(m, b) for m in MECHANISMS for b in ["auto", *available(m)]]
)
def test_output_has_the_input_shape(name, backend):
    """Every backend that backend_status says runs on CPU serves the plain float32 calls:
    (B, N, D) -> (B, N, D) (an axial or MSA input keeps its shape), float32 and finite, at
    lengths 1 and 7 (the plain config) and 7 (every other config), causal and not where
    served, with and without autograd."""
    for i, config in enumerate(SPECS[name].configs):
        with refused_by_declaration(plain=i == 0):
            m = build(name, config, backend, torch.float32)
            for n in (1, 7) if i == 0 else (7,):
                x = randn(input_shape(name, config, n), n, torch.float32)
                for is_causal in causal_modes(name):
                    with torch.no_grad():
                        out = m(x, is_causal=is_causal)
                    assert out.shape == x.shape and out.dtype == torch.float32
                    assert out.isfinite().all()
                    out = m(x.requires_grad_(True), is_causal=is_causal)
                    out.sum().backward()
                    assert x.grad.shape == x.shape and x.grad.isfinite().all()
                    x.grad = None


@pytest.mark.parametrize(
    "name, kind, is_causal", [(m, *call) for m in MECHANISMS for call in calls(m)]
)
def test_backends_agree_in_float64(name, kind, is_causal):
    """Every available backend against the float64 naive module (the kit): outputs and the
    gradients of the input and every parameter, atol 1e-10, rtol 1e-8, at lengths 1 and 7 (the
    plain config) and 7 (every other config); boolean masks per query or per key (padding) and
    additive float masks, rows with no allowed key among them. A backend may refuse by a
    capability it declares (a mask, an option, float64)."""
    for i, config in enumerate(SPECS[name].configs):
        for n in (1, 7) if i == 0 else (7,):
            shape = input_shape(name, config, n)
            mask = None if kind == "none" else make_mask(kind, shape, seed=n)
            report = assert_mechanism_backends_agree(
                name, config, shape=shape, attn_mask=mask, is_causal=is_causal,
                dtype=torch.float64, seed=n,
            )  # fmt: skip
            check_report(name, report, every=False)


@settings(max_examples=5)
@given(data=st.data())
@pytest.mark.parametrize("name", MECHANISMS)
def test_backends_agree_on_drawn_calls(name, data):
    """Hypothesis, 5 examples a mechanism: a config, a length of 1 to 20 (edges first), a
    call the mechanism serves (masks, causality) and a seed drawn; the kit in float64 as
    above."""
    config = data.draw(st.sampled_from(SPECS[name].configs), label="config")
    shape = input_shape(name, config, data.draw(lengths(20), label="length"))
    kind, is_causal = data.draw(st.sampled_from(calls(name)), label="call")
    seed = data.draw(st.integers(0, 999), label="seed")
    mask = None if kind == "none" else make_mask(kind, shape, seed)
    report = assert_mechanism_backends_agree(
        name, config, shape=shape, attn_mask=mask, is_causal=is_causal,
        dtype=torch.float64, seed=seed,
    )  # fmt: skip
    check_report(name, report, every=False)


@pytest.mark.parametrize(
    "name, is_causal",
    [(m, c) for m in MECHANISMS if SPECS[m].layout == "sequence" for c in causal_modes(m)],
)
def test_backends_agree_in_float32_at_every_block_edge(name, is_causal):
    """The kit in float32 (atol 1e-5, grads 5e-5, rtol 1e-4, each grown by twice the naive
    module's own float32 error) at lengths 1, 9 and around every block size a backend of the
    mechanism's kernels declares (`mechanism_lengths`), the plain config on every available
    backend."""
    report = assert_mechanism_backends_agree(name, SPECS[name].configs[0], is_causal=is_causal)
    check_report(name, report, every=True)


def positions(x: torch.Tensor) -> torch.Tensor:
    """x (B, ..., D) as (B, positions in raster order, D), a view."""
    return x.flatten(1, -2)


@pytest.mark.parametrize("name, backend", where(lambda m: serves(m).causal))
def test_causal_output_ignores_future_tokens(name, backend):
    """Causal (with RoPE where taken): outputs before position 4 of 7 (raster order) are the
    same, atol 1e-12 (float32-only backends 1e-6), when the later tokens change; without
    causality they change (a mechanism that is not causal-only sees the future)."""
    what, dtype = serves(name), dtype_for(name, backend)
    for i, config in enumerate(SPECS[name].configs):
        with refused_by_declaration(plain=i == 0):
            m = build(name, config, backend, dtype)
            x = randn(input_shape(name, config, 7), dtype=dtype)
            changed = x.clone()
            positions(changed)[:, 4:] = randn(positions(x)[:, 4:].shape, 1, dtype)
            extra = {"rope": rope_for(m, 7)} if what.rope else {}
            with torch.no_grad():
                before = positions(m(x, is_causal=True, **extra))[:, :4]
                after = positions(m(changed, is_causal=True, **extra))[:, :4]
                torch.testing.assert_close(after, before, atol=TOLERANCE[dtype], rtol=0)
                if not what.causal_only:
                    seen = positions(m(changed, **extra))[:, :4] - positions(m(x, **extra))[:, :4]
                    assert seen.abs().max() > 1e-3


@pytest.mark.parametrize("name, backend", where(lambda m: serves(m).masks is not None))
def test_a_padding_mask_hides_the_padded_tokens(name, backend):
    """Changing the tokens a padding mask hides changes no other position's output, atol
    1e-12 (float32-only backends 1e-6): keys (B, 1, 1, N) hiding the last 3 of 7 positions,
    causal and not, or an MSA's padded tokens."""
    what, dtype = serves(name), dtype_for(name, backend)
    for config in SPECS[name].configs:
        m = build(name, config, backend, dtype)
        x = randn(input_shape(name, config, 7), dtype=dtype)
        changed = x.clone()
        if what.masks == "padding":
            mask = real = make_mask("padding", x.shape)
        else:
            mask = torch.arange(7).view(1, 1, 1, 7).expand(2, 1, 1, 7) < 4
            real = mask[:, 0, 0]
        changed[~real] = randn(changed[~real].shape, 1, dtype)
        for is_causal in causal_modes(name):
            with refused_by_declaration(plain=False), torch.no_grad():  # may declare no mask
                got = m(changed, attn_mask=mask, is_causal=is_causal)[real]
                want = m(x, attn_mask=mask, is_causal=is_causal)[real]
                torch.testing.assert_close(got, want, atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("name, backend", where(lambda m: serves(m).masks == "attention"))
def test_a_zero_or_minus_inf_float_mask_is_its_boolean_mask(name, backend):
    """An additive mask of 0 (allowed) and -inf (masked) gives the boolean mask's output,
    atol 1e-12 (float32-only backends 1e-6), per query and per key, causal and not."""
    dtype = dtype_for(name, backend)
    for config in SPECS[name].configs:
        m = build(name, config, backend, dtype)
        x = randn(input_shape(name, config, 7), dtype=dtype)
        for kind, is_causal in (("mask", False), ("mask", True), ("key_mask", True)):
            allowed = make_mask(kind, x.shape)
            additive = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, -torch.inf)
            with refused_by_declaration(plain=False), torch.no_grad():  # may declare no mask
                want = m(x, attn_mask=allowed, is_causal=is_causal)
                got = m(x, attn_mask=additive, is_causal=is_causal)
                torch.testing.assert_close(got, want, atol=TOLERANCE[dtype], rtol=0)


@contextmanager
def kernel_outputs():
    """Within the block, every registered kernel backend also appends to the list yielded its
    output of each call given an attn_mask (the backends restored after)."""
    outputs, saved = [], []
    for name in FAMILIES.names():
        backends = family(name).backends
        for key, backend in list(backends.items()):

            def spy(*args, _fn=backend.fn, **kwargs):
                out = _fn(*args, **kwargs)
                if kwargs.get("attn_mask") is not None:
                    outputs.append(out)
                return out

            saved.append((backends, key, backend))
            backends[key] = dataclasses.replace(backend, fn=spy)
    try:
        yield outputs
    finally:
        for backends, key, backend in saved:
            backends[key] = backend


@pytest.mark.parametrize("name, backend", where(lambda m: serves(m).masks == "attention"))
def test_a_query_with_no_allowed_key_gives_zeros_and_finite_gradients(name, backend):
    """Causal, with batch 0's first two keys masked (boolean, and additive float with finite
    values elsewhere): its first two query rows see no key. Every kernel call given the mask
    outputs exactly zero there; the mechanism's output and the gradients of the input and of
    every parameter are finite."""
    dtype = dtype_for(name, backend)
    for config in SPECS[name].configs:
        m = build(name, config, backend, dtype)
        keep = make_mask("key_mask", (2, 7, config["d_model"]))
        for mask in (keep, randn(keep.shape, 2, dtype).masked_fill(~keep, -torch.inf)):
            x, out = randn((2, 7, config["d_model"]), dtype=dtype).requires_grad_(True), None
            with refused_by_declaration(plain=False), kernel_outputs() as outputs:
                out = m(x, attn_mask=mask, is_causal=True)
            if out is None:  # refused: a kernel declares no mask
                continue
            for kernel_out in outputs:
                assert torch.equal(kernel_out[0, :, :2], torch.zeros_like(kernel_out[0, :, :2]))
            assert out.isfinite().all()
            grads = torch.autograd.grad(out.square().sum(), [x, *m.parameters()], allow_unused=True)
            assert all(g.isfinite().all() for g in grads if g is not None)


def symbols_for(x: torch.Tensor) -> torch.Tensor:
    return randn(x.shape, seed=3, dtype=x.dtype)


@pytest.mark.parametrize("name", MECHANISMS)
def test_what_a_mechanism_does_not_serve_is_refused_by_name(name):
    """A ValueError naming what is not served: symbols (mechanisms that read none; those that
    document them as unused give the same output), an attn_mask, causality, non-causal calls
    (causal-only mechanisms), RoPE, a cache (supports_cache False), attention maps (none)."""
    s, what = SPECS[name], serves(name)
    m = build(name, s.configs[0])
    x = randn(input_shape(name, s.configs[0], 5))
    call = {"is_causal": what.causal_only}
    if not what.symbols:
        if s.ignores_symbols:
            torch.testing.assert_close(m(x, symbols_for(x), **call), m(x, **call))
        else:
            with pytest.raises(ValueError, match="reads no symbols"):
                m(x, symbols_for(x), **call)
    if what.masks is None:
        with pytest.raises(ValueError, match="attn_mask"):
            m(x, attn_mask=torch.ones(5, 5, dtype=torch.bool), **call)
    if not what.causal:
        with pytest.raises(ValueError, match="is_causal"):
            m(x, is_causal=True)
    if what.causal_only:
        with pytest.raises(ValueError, match="causal only"):
            m(x, is_causal=False)
    if what.takes_rope and not what.rope:
        with pytest.raises(ValueError, match="does not support rope"):
            m(x, rope=Rotary(*rotary_tables(4, 5)), **call)
    if what.takes_cache and not getattr(m, "supports_cache", False):
        with pytest.raises(ValueError, match="cache"):
            m(x, is_causal=True, cache=LayerCache())
    if not what.maps:
        with (
            pytest.raises(ValueError, match="no module with attention_maps"),
            recording_attention(m),
        ):
            pass


@pytest.mark.parametrize("name", MECHANISMS)
def test_the_backend_changes_no_parameter_and_a_bad_name_is_refused(name):
    """The state_dict's keys and shapes are the same whatever the backend (given at build or
    set later) and load into any other; an unknown backend is a ValueError listing the valid
    ones, at build and when set, leaving the backend as it was."""
    for config in SPECS[name].configs:
        m = build(name, config, "naive")
        keys = {k: v.shape for k, v in m.state_dict().items()}
        for backend in available(name):
            other = build(name, config, backend)
            assert {k: v.shape for k, v in other.state_dict().items()} == keys, backend
            other.load_state_dict(m.state_dict())
            m.backend = backend
            assert {k: v.shape for k, v in m.state_dict().items()} == keys, backend
        with pytest.raises(ValueError, match=r"'bogus'.*Valid: auto, "):
            m.backend = "bogus"
        assert m.backend == available(name)[-1]
        with pytest.raises(ValueError, match=r"'bogus'.*Valid: auto, "):
            az.build(name, backend="bogus", **config)


@pytest.mark.parametrize(
    "name, keyword", [(m, k) for m in MECHANISMS for k in az.mechanism_kwargs(m)]
)
def test_a_misspelt_keyword_is_named_with_the_closest_one(name, keyword):
    """Each keyword of the constructor, its last letter dropped: a ValueError naming it and
    suggesting the keyword."""
    wrong = keyword[:-1]
    with pytest.raises(ValueError, match=f"'{wrong}'. Did you mean '{keyword}'"):
        az.build(name, **{**SPECS[name].configs[0], wrong: 1})


@pytest.mark.parametrize("name, backend", where(lambda m: serves(m).dropout))
def test_dropout_acts_in_training_only(name, backend):
    """dropout=0.5: two calls in eval mode give the same output, two in training differ (a
    backend that declares no dropout refuses the training call by its capabilities)."""
    config = {**SPECS[name].configs[0], "dropout": 0.5}
    m = build(name, config, backend, torch.float32)
    x = randn(input_shape(name, config, 9), dtype=torch.float32)
    torch.testing.assert_close(m(x), m(x), atol=0, rtol=0)
    m.train()
    try:
        first = m(x)
    except UnsupportedCallError as err:
        assert "dropout" in str(err), err
        return
    assert not torch.allclose(first, m(x))


@pytest.mark.parametrize("name", MECHANISMS)
def test_trains_a_few_steps(name):
    """25 Adam steps (lr 1e-2) towards a random target bring the squared error below 0.9 of
    its start (batch 4, length 8), causal where served, on the chunked tier where the
    mechanism has one."""
    config = SPECS[name].configs[0]
    backends = az.list_backends(name)
    m = build(name, config, "chunked" if "chunked" in backends else "auto", torch.float32).train()
    x = randn(input_shape(name, config, 8, batch=4), 1, torch.float32)
    target = randn(x.shape, 2, torch.float32)
    is_causal = serves(name).causal
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(25):
        loss = (m(x, is_causal=is_causal) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("name, backend", where(lambda m: serves(m).takes_cache))
def test_cached_calls_give_the_uncached_output(name, backend):
    """Where supports_cache: 9 positions fed 4, 1 and 4 at a time with a LayerCache (each call
    causal bottom-right) give the causal output of one call, atol 1e-12 (float32-only backends
    1e-6), rtol 0; a backend may refuse bottom-right calls (a mask) by its capabilities."""
    dtype = dtype_for(name, backend)
    for config in SPECS[name].configs:
        m = build(name, config, backend, dtype)
        if not m.supports_cache:
            continue
        x = randn(input_shape(name, config, 9), dtype=dtype)
        cache = LayerCache()
        with refused_by_declaration(plain=False), torch.no_grad():
            parts = [m(x[:, a:b], is_causal="bottom_right", cache=cache)
                     for a, b in ((0, 4), (4, 5), (5, 9))]  # fmt: skip
            want = m(x, is_causal=True)
            torch.testing.assert_close(torch.cat(parts, 1), want, atol=TOLERANCE[dtype], rtol=0)
            assert cache.length == 9


@pytest.mark.parametrize("name, backend", where(lambda m: serves(m).maps))
def test_attention_maps_are_the_same_on_every_backend_and_zero_where_masked(name, backend):
    """record_attention_maps on causal calls, without and with a mask: every module's
    "attention" (B, H, N, N) is finite, exactly 0 at future and masked keys, and every map is
    the naive backend's (a backend may refuse the mask by its capabilities)."""
    config, dtype = SPECS[name].configs[0], dtype_for(name, backend)
    x = randn(input_shape(name, config, 7), dtype=dtype)
    for mask in (None, make_mask("mask", x.shape)):
        allowed = torch.ones(7, 7, dtype=torch.bool).tril() & (True if mask is None else mask)
        with refused_by_declaration(plain=mask is None):
            maps = {
                b: record_attention_maps(
                    build(name, config, b, dtype), x, attn_mask=mask, is_causal=True
                )
                for b in ("naive", backend)
            }
            assert maps[backend]
            for module, recorded in maps[backend].items():
                attention = recorded["attention"]
                assert attention.shape[::2] == (2, 7) and attention.shape[-1] == 7
                assert attention.isfinite().all()
                assert (attention.masked_fill(allowed, 0) == 0).all(), module
                for kind, tensor in recorded.items():
                    assert torch.equal(tensor, maps["naive"][module][kind]), (module, kind)


@pytest.mark.parametrize("name, backend", where(lambda m: not serves(m).causal_only))
def test_permuting_the_tokens_permutes_the_output(name, backend):
    """No positions given: permuting the first attended axis (tokens, an axial input's first
    axis, an MSA's rows) permutes the output the same way, atol 1e-12 (float32-only backends
    1e-6), rtol 0."""
    dtype = dtype_for(name, backend)
    perm = [2, 0, 1] if SPECS[name].layout == "msa" else [3, 0, 6, 1, 5, 2, 4]
    for i, config in enumerate(SPECS[name].configs):
        with refused_by_declaration(plain=i == 0):
            m = build(name, config, backend, dtype)
            x = randn(input_shape(name, config, 7), dtype=dtype)
            with torch.no_grad():
                got, want = m(x[:, perm]), m(x)[:, perm]
            torch.testing.assert_close(got, want, atol=TOLERANCE[dtype], rtol=0)
