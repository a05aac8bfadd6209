"""Capability-based choice of a kernel backend.

A *kernel family* (``softmax``, ``relational``, ...) is one mathematical operation with several
implementations, its *backends*. Each backend declares what it can serve (`Capabilities`) and,
optionally, whether its software is present at all (``available``). A call is summarised as a
`Call` (device, dtype and the features it needs); `KernelFamily.select` then resolves a backend
name:

- a registered name (``naive``, ``sdpa``, ...) forces that backend, or raises
  `UnsupportedCallError` naming the reason and the backends that would serve;
- a tier name (``naive``, ``chunked``, ``fused``) that is not itself registered picks the
  highest-priority backend of that tier that fits;
- ``auto`` picks the highest-priority backend that fits; each refusal is logged once.

A family is defined once (`define_family`: its name, how to check a call's inputs, how to
describe it and, optionally, how to lower a call for backends that lack a native feature) and
its backends register themselves in their own files (`register_backend`). Calling the family,
``family(backend, **kwargs)``, checks the inputs, selects, lowers and runs; the capabilities a
backend declares are the only source of its refusals.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch

from attn_zoo.registry import Registry, record_change, unknown_name_error

# attn_zoo/: where built-in backends' code lies (`plugin_backends_first`)
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

log = logging.getLogger("attn_zoo")

TIERS = ("naive", "chunked", "fused")
FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


class UnsupportedCallError(ValueError):
    """A backend was asked for a call its capabilities do not cover.

    `reasons` maps each backend that was tried to why it refused.
    """

    def __init__(self, message: str, reasons: dict[str, str]):
        super().__init__(message)
        self.reasons = reasons


@dataclass(frozen=True)
class Call:
    """What a kernel call needs: where it runs and which optional features it uses.

    `features` holds names such as ``grad``, ``mask``, ``causal``, ``dropout``, ``dv_ne_dk``
    (value head width differs from key head width) and ``gqa`` (fewer key/value heads than query
    heads); families may add their own (e.g. ``rel_activation``).
    """

    device: str
    dtype: torch.dtype
    features: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Capabilities:
    """What a backend serves. `why` explains a refusal, keyed by feature or device name.

    Feature names (a call needs those its inputs use; see each family's family.py):

        grad              inputs require grad (a backward is needed)
        mask, float_mask  an attention mask; float_mask: an additive float one
        key_mask          (linear, additive) a mask that is the same for every query
        causal            top-left causality (bottom-right with N != M arrives as a mask)
        dropout           dropout on the attention weights
        dv_ne_dk          value head width != key head width (softmax, linear)
        gqa               fewer key/value heads than query heads
        narrow_heads      (softmax) a key or value head width below 16
        score_mod         (softmax) a score mod (mods.py)
        impure_mod        (softmax) a mod declaring pure = False, and a backward: only for a
                          backend calling each mod once per tile, in the forward
        mod_grad          (softmax) a score mod capturing a tensor that requires grad: only for
                          a backend giving that tensor its gradient
        saturated_mask    (softmax) a backward through an additive mask with a row whose every
                          key is masked by a finite value below -100 (float32's min): only for
                          a backend keeping each row's max and log-sum apart
        rel_activation    (relational) a relation activation other than identity
        relative_symbols  (relational) symbol values by relative position, v_rel
        no_keys           (relational) M = 0 keys
        no_queries        (relational) N = 0 queries
        pair_symbols      (relational) dense symbol values per (query, key) pair, v_pair

    A backend may also declare a feature no call needs but that changes what it receives:

        bottom_right      (softmax, relational) takes is_causal="bottom_right" (N != M) as is;
                          without it the call arrives as an explicit (N, M) mask

    devices: device types ("cpu", "cuda"); dtypes: served dtypes; grad_devices: devices with
    a backward (None: all).
    """

    features: frozenset[str]
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    dtypes: frozenset[torch.dtype] = FLOAT_DTYPES
    grad_devices: frozenset[str] | None = None  # devices with a backward; None: every device
    why: dict[str, str] = field(default_factory=dict)

    def refusal(self, call: Call) -> str | None:
        """None if the call fits, else the reason it does not."""
        if call.device not in self.devices:
            return self._explain(
                call.device, f"no kernel for device {call.device!r} (has: {sorted(self.devices)})"
            )
        if call.dtype not in self.dtypes:
            names = sorted(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"dtype {call.dtype} not supported (supports: {', '.join(names)})"
        missing = sorted(call.features - self.features)
        if missing:
            explained = next((f for f in missing if f in self.why), missing[0])
            return self._explain(explained, f"does not support {', '.join(missing)}")
        no_backward = self.grad_devices is not None and call.device not in self.grad_devices
        if "grad" in call.features and no_backward:
            return self._explain(
                "grad", f"has no backward on {call.device} (needed: inputs require grad)"
            )
        return None

    def _explain(self, key: str, reason: str) -> str:
        return f"{reason}: {self.why[key]}" if key in self.why else reason


@dataclass(frozen=True)
class Backend:
    """One implementation of a kernel family."""

    name: str
    fn: Callable
    tier: str
    priority: int | Mapping[str, int]  # higher is preferred by ``auto``; or per device type
    capabilities: Capabilities
    available: Callable[[], str | None] = lambda: None  # None, or why the software is missing
    block_sizes: tuple[int, ...] = ()  # the tile lengths it splits N or M by (testing draws
    # the lengths around them: attn_zoo.testing.block_edges)

    def refusal(self, call: Call) -> str | None:
        return self.capabilities.refusal(call) or self.available()

    def rank(self, device: str | None = None) -> int:
        """Priority on `device` (None: the best over devices)."""
        if isinstance(self.priority, int):
            return self.priority
        return self.priority[device] if device in self.priority else max(self.priority.values())


class KernelFamily:
    """A named operation and its registered backends.

    check:    the kernel's keyword arguments -> the same, validated and normalised (e.g. the
              mask viewed as 4-D); raises ValueError naming the bad argument.
    describe: the (checked) keyword arguments -> the `Call` they make, for backend choice; the
              testing kit uses it to know which backends serve a problem.
    lower:    (checked kwargs, a backend's declared features) -> the kwargs that backend
              takes (e.g. bottom-right causality as a mask for a backend without the
              ``bottom_right`` feature); None: every backend takes the checked kwargs.
    """

    def __init__(
        self,
        name: str,
        check: Callable[..., dict],
        describe: Callable[..., Call],
        lower: Callable[[dict, frozenset[str]], dict] | None = None,
    ):
        self.name, self.check, self.describe, self.lower = name, check, describe, lower
        self.backends: dict[str, Backend] = {}
        self._logged: set[tuple[str, str]] = set()

    def __call__(self, backend: str = "auto", **kwargs):
        """Check the inputs, choose the backend named `backend` for them, run it."""
        kwargs = self.check(**kwargs)
        chosen = self.select(backend, self.describe(**kwargs))
        return chosen.fn(**self.backend_inputs(kwargs, chosen.capabilities.features))

    def backend_inputs(self, kwargs: dict, features: frozenset[str] = frozenset()) -> dict:
        """Checked `kwargs` as a backend declaring `features` receives them (see `lower`)."""
        return kwargs if self.lower is None else self.lower(kwargs, features)

    def register(self, backend: Backend, replace: bool = False) -> None:
        """Add `backend`. A taken name is refused, unless `replace` (recorded, as in every
        registry: attn_zoo.registry.replaced_names)."""
        if backend.tier not in TIERS:
            raise ValueError(
                f"tier {backend.tier!r} of backend {backend.name!r}: use one of {TIERS}"
            )
        if backend.name in ("auto", *TIERS) and backend.name != backend.tier:
            raise ValueError(
                f"backend name {backend.name!r} is a tier name: register it with that tier"
            )
        kind, taken = f"{self.name} backend", self.backends.get(backend.name)
        if taken is not None and not replace:
            raise ValueError(
                f"{kind} {backend.name!r} is already registered: {taken.fn!r}; pass "
                "replace=True to replace it (recorded: attn_zoo.registry.replaced_names)"
            )
        if taken is None:
            undo = partial(self.backends.pop, backend.name)
        else:
            undo = partial(self.backends.__setitem__, backend.name, taken)
        self.backends[backend.name] = backend
        record_change(kind, backend.name, undo, replaced=taken is not None)

    def block_sizes(self) -> tuple[int, ...]:
        """Every tile length a backend of the family declares, sorted."""
        return tuple(sorted({n for b in self.backends.values() for n in b.block_sizes}))

    def names(self) -> list[str]:
        """Registered backend names plus the tier names they make usable, in priority order."""
        ordered = sorted(self.backends.values(), key=lambda b: -b.rank())
        names = [b.name for b in ordered]
        names += [t for t in TIERS if t not in names and any(b.tier == t for b in ordered)]
        return names

    def check_name(self, name: str) -> None:
        if name != "auto" and name not in self.names():
            raise unknown_name_error(f"{self.name} backend", name, ["auto", *self.names()])

    def candidates(self, name: str, device: str) -> list[Backend]:
        """Backends `name` may resolve to on `device`, best first."""
        self.check_name(name)
        if name in self.backends:
            return [self.backends[name]]
        ordered = sorted(self.backends.values(), key=lambda b: -b.rank(device))
        return [b for b in ordered if name == "auto" or b.tier == name]

    def select(self, name: str, call: Call) -> Backend:
        """The backend that serves `call` under the name `name` (see module docstring)."""
        refused = []
        for backend in self.candidates(name, call.device):
            reason = backend.refusal(call)
            if reason is None:
                for record in _RECORDS:
                    record.append(Choice(self.name, name, backend.name, call, dict(refused)))
                return backend
            refused.append((backend.name, reason))
            if name != backend.name and (backend.name, reason) not in self._logged:
                self._logged.add((backend.name, reason))
                _log_skip(self.name, backend.name, reason)
        serving = [b.name for b in self.backends.values() if b.refusal(call) is None]
        why = "; ".join(f"{b}: {r}" for b, r in refused)
        raise UnsupportedCallError(
            f"{self.name} backend {name!r} cannot serve this call ({call.device}, "
            f"{call.dtype}, features {sorted(call.features)}): {why}. "
            f"Backends that can: {', '.join(serving) or '(none)'}.",
            dict(refused),
        )

    def status(
        self, name: str, device: str, features: frozenset[str] = frozenset()
    ) -> tuple[bool, str]:
        """(ok, reason) for `name` on `device`, for a plain float32 call needing `features`
        only (those every call of a mechanism needs: a softcapped layer's score_mod)."""
        try:
            backend = self.select(name, Call(device, torch.float32, features))
        except UnsupportedCallError as err:
            return False, str(err)
        picked = "" if backend.name == name else f" (picks {backend.name!r})"
        return True, f"available on {device}{picked}"


def constant_when_compiled(fn: Callable) -> Callable:
    """`torch.compiler.assume_constant_result(fn)` without importing torch._dynamo: the traced
    code takes `fn`'s result as a constant (Dynamo calls it while tracing). torch's decorator
    imports Dynamo to set one marker, which took 1.9 s of every process's start here (the CLI,
    each grid worker); this sets the same marker (tests/test_compile.py checks that it is the
    one torch's decorator sets)."""
    fn._dynamo_marked_constant = True  # what torch._dynamo.decorators.assume_constant_result sets
    return fn


# A logging call inside torch.compile is a graph break (an error with fullgraph=True). Marked
# as a constant, the compiler calls it while tracing instead: logged once, when the choice is
# made, as in eager mode.
@constant_when_compiled
def _log_skip(family_name: str, backend: str, reason: str) -> None:
    log.info("%s backend %r skipped: %s", family_name, backend, reason)


@dataclass(frozen=True)
class Choice:
    """One backend choice: the family, the name asked for, the backend chosen, the call, and
    why each backend tried before it was refused."""

    family: str
    asked: str
    chosen: str
    call: Call
    refused: dict[str, str]

    def __str__(self) -> str:
        call = f"{self.call.device}, {str(self.call.dtype).removeprefix('torch.')}, " + (
            f"features {sorted(self.call.features)}"
        )
        line = f"{self.family}: {self.asked!r} -> {self.chosen!r} ({call})"
        return line + "".join(f"\n  skipped {b!r}: {r}" for b, r in self.refused.items())


_RECORDS: list[list[Choice]] = []  # lists being filled by `recording_choices`


@contextmanager
def recording_choices() -> Iterator[list[Choice]]:
    """Collect every backend choice made inside the block, in order."""
    record: list[Choice] = []
    _RECORDS.append(record)
    try:
        yield record
    finally:
        _RECORDS.remove(record)


def explain(fn: Callable, *args, **kwargs) -> list[Choice]:
    """Call `fn(*args, **kwargs)` (a module, a kernel function, a model) and return the backend
    choices it made: which backend served each kernel call and why the ones before it were
    refused. ``print(*explain(m, x, is_causal=True), sep="\n")``."""
    with recording_choices() as choices:
        fn(*args, **kwargs)
    return choices


FAMILIES: Registry[KernelFamily] = Registry("kernel family")


def define_family(
    name: str,
    check: Callable[..., dict],
    describe: Callable[..., Call],
    lower: Callable[[dict, frozenset[str]], dict] | None = None,
) -> KernelFamily:
    """Create and register the kernel family `name` (see `KernelFamily`)."""
    return FAMILIES.register(name, KernelFamily(name, check, describe, lower))


def family(name: str) -> KernelFamily:
    """The kernel family `name` (ValueError with the valid names if there is none)."""
    return FAMILIES[name]


def plugin_backends_first() -> list[str]:
    """Each backend defined outside attn_zoo (its function's module: a plugin's) that outranks
    a built-in backend of its family, a higher priority on a device both serve, as "<family>
    backend <name>". ``auto`` (and a tier name) then picks it for the calls it fits where
    the built-in one would have served, so the results of built-in mechanisms come from its
    code: each cell's environment records these ("outranking", ablations/run/train.py), as it
    records replaced names (attn_zoo.registry.replaced_names)."""
    found = []
    for name in FAMILIES.names():
        backends = FAMILIES[name].backends.values()
        built_in = [b for b in backends if _built_in(b)]
        for backend in backends:
            if not _built_in(backend) and any(_outranks(backend, b) for b in built_in):
                found.append(f"{name} backend {backend.name}")
    return found


def _built_in(backend: Backend) -> bool:
    """Whether `backend`'s function is code of this package: by the file its code object was
    compiled from (functools.wraps copies a built-in's __module__ onto a plugin's function, not
    its code); a callable without Python code (an instance, a partial) is a plugin's."""
    code = getattr(backend.fn, "__code__", None)
    return code is not None and os.path.abspath(code.co_filename).startswith(PACKAGE + os.sep)


def _outranks(backend: Backend, other: Backend) -> bool:
    """Whether `backend` has a higher priority than `other` on a device both serve."""
    shared = backend.capabilities.devices & other.capabilities.devices
    return any(backend.rank(device) > other.rank(device) for device in shared)


def register_backend(
    family_name: str,
    name: str,
    *,
    tier: str,
    priority: int | Mapping[str, int],
    capabilities: Capabilities,
    available: Callable[[], str | None] | None = None,
    block_sizes: tuple[int, ...] = (),
    replace: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as backend `name` of kernel family `family_name`; returns `fn`
    unchanged (the raw kernel: call it through the family, which checks the call against the
    capabilities declared here). `block_sizes`: the tile lengths it splits sequences by, so
    that tests draw the lengths where it changes (attn_zoo.testing). A taken name (a built-in
    backend's, another plugin's) is refused unless `replace`, which is recorded
    (attn_zoo.registry.replaced_names).

    >>> @register_backend("softmax", "mine", tier="fused", priority=5,
    ...                   capabilities=Capabilities(features=frozenset({"grad"})))
    ... def my_kernel(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0): ...
    """

    def decorate(fn: Callable) -> Callable:
        kwargs = {} if available is None else {"available": available}
        family(family_name).register(
            Backend(name, fn, tier, priority, capabilities, **kwargs, block_sizes=block_sizes),
            replace=replace,
        )
        return fn

    return decorate
