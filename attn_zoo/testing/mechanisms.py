"""Compare a mechanism's backends: same parameters, float64 naive reference.

Outputs, the gradient of the input and of every parameter are compared with the per-dtype
tolerances of `attn_zoo.testing.agreement`, each tensor's atol grown by twice the error the
naive backend itself makes on that tensor in the checked dtype (e = its worst |naive_dtype -
naive_float64|), e counted up to a bound. The whole layer runs in the dtype (parameters,
projections, norms, the kernel), and a parameter's gradient sums B N per-position terms, so the
layer's own rounding can exceed the fixed tolerances for every backend alike: in bfloat16,
weight gradients off by 0.1-1.5 (N 9-513; fixed atol 0.05), and even in float32 (gla with fast
gates, tau=0.5, N = 130: 1e-3 in gradients of 1e2). Why twice: got - want = (got - naive_dtype)
+ (naive_dtype - want); the second term is e, and the first, for a correct backend, is the
rounding of the same sums in another order, of the size of e; so |got - want| <= 2 e plus the
fixed tolerances. The largest share of e a correct backend used, over every registered
mechanism and CPU backend (N 9, 33, 255, 513; three or four seeds each; d_model 16): bfloat16
1.05 (differential on sdpa, N = 255), float16 0.87, float32 within the fixed tolerances; the
chunked gla kernel stayed within 1 e on 324 float32 problems.

The bound: e counts up to `FLOOR_BOUND` (4) fixed tolerances at the tensor's largest value, 4 (atol
+ rtol max|naive_float64|), and the naive backend's own run in the dtype is held to that bound (plus
the fixed tolerances): a naive path wrong in the dtype fails, named, instead of widening every
backend's tolerance by its own error. Over every built-in mechanism (N 9 and 33, two seeds;
differential, gla and softcapped also at N 255), e was at most 0.9 such tolerance in bfloat16
(differential's lambda_q1 at N 255; 0.69 at N 33) and 0.013 in float32 (gla's fast gates above, 1e-3
in gradients of 1e2: about 0.1). A wrong kernel errs by the order of the values themselves. Modules
run in eval mode: dropout is not checked (docs/testing_kit.md). Without a `length`, every length
where one of its kernels' backends changes is checked (`mechanism_lengths`: 1, 9 and the
`block_edges` of each declared block size), so a backend that mishandles a partial last block cannot
pass on short inputs alone. Masks are drawn by default (key padding and per query, boolean and
additive, rows that see no key among them: `MECHANISM_MASKS`), one kind per length in turn besides
the call without a mask, so a backend that drops or misreads the mask cannot pass either; a mask the
mechanism itself refuses is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from attn_zoo.kernels.dispatch import UnsupportedCallError, family
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.registry import build, list_backends
from attn_zoo.testing.agreement import (
    Cotangent,
    compare,
    cotangent_from,
    disagreements,
    tolerance,
)
from attn_zoo.testing.problems import (
    MECHANISM_MASKS,
    check_mechanism_call,
    check_mechanism_mask,
    check_names,
    mechanism_mask,
)
from attn_zoo.testing.strategies import block_edges


def mechanism_lengths(module: torch.nn.Module) -> list[int]:
    """1, 9 and the `block_edges` of every block size that a backend of a kernel family the
    module (or any mechanism inside it) calls declares, sorted."""
    families = {m.kernel_family for m in module.modules() if isinstance(m, AttentionMechanism)}
    blocks = {b for name in families for b in family(name).block_sizes()}
    return sorted({1, 9, *(n for b in blocks for n in block_edges(b))})


PLAIN = "output without grad"  # the output of the call under torch.no_grad
FLOOR_BOUND = 4.0  # the naive backend's own error counts up to this many tolerances (module)


def floor_bound(key: str, want: torch.Tensor, dtype: torch.dtype) -> float:
    """How far the naive backend's own `dtype` run may be off its float64 run `want` on tensor
    `key`: `FLOOR_BOUND` (atol + rtol max|want|), the `dtype` tolerance at the largest value."""
    atol, rtol = tolerance(key, dtype)
    return FLOOR_BOUND * (atol + rtol * (float(want.abs().max()) if want.numel() else 0.0))


def _outputs_and_grads(module, x, cotangent: Cotangent, **call) -> dict:
    x = x.detach().clone().requires_grad_(True)
    out = module(x, **call)
    params = dict(module.named_parameters())
    vector = cotangent(out.shape).to(out.dtype)
    grads = torch.autograd.grad(out, [x, *params.values()], vector, allow_unused=True)
    result = {"output": out, "grad x": grads[0]}
    for name, g in zip(params, grads[1:], strict=True):
        result[f"grad {name}"] = torch.zeros_like(params[name]) if g is None else g
    return result


def drawn_calls(lengths: Sequence[int], masks: Sequence[str], seed: int) -> list[tuple[int, str]]:
    """(length, mask kind) of each call the kit draws: every length without a mask ("none"),
    then the kinds of `masks` in turn over the lengths (from the `seed`-th), every kind at
    least once."""
    turns = range(max(len(lengths), len(masks))) if masks else ()
    drawn = [(lengths[i % len(lengths)], masks[(i + seed) % len(masks)]) for i in turns]
    return [*((n, "none") for n in lengths), *drawn]


def assert_mechanism_backends_agree(
    mechanism: str,
    kwargs: Mapping,
    batch: int = 2,
    length: int | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    symbols: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    backends: Sequence[str] | None = None,
    seed: int = 0,
    shape: Sequence[int] | None = None,
    masks: Sequence[str] = MECHANISM_MASKS,
) -> dict[str, str]:
    """Build `mechanism` with `kwargs`, run each backend on random inputs (batch, length,
    d_model) and check output and gradients against the float64 ``naive`` backend (atol grown
    by twice the ``naive`` backend's own error in `dtype`, counted up to `FLOOR_BOUND`
    tolerances, and the ``naive`` backend held to that bound: see the module). Without `length`
    (and `shape`), at every length of `mechanism_lengths` (an `attn_mask` or `symbols` then
    needs its `length`).

    masks: without an `attn_mask`, the kinds of mask drawn besides the call without one
    (`MECHANISM_MASKS`: key padding and per query, boolean and additive float, rows that see
    no key among them; `problems.mechanism_mask`), in turn over the lengths (`drawn_calls`:
    every kind at least once, each at a given `length`). A drawn mask the mechanism refuses
    (its naive backend raises ValueError or UnsupportedCallError: gla takes none, linear
    attention's kernels refuse masks per query) is skipped, and so is a backend on a drawn
    mask its capabilities refuse. ``masks=()``: no mask drawn.

    shape: the input's shape instead of (batch, length, d_model), for mechanisms whose input
    has another rank or layout (axial attention, MSA attention); `batch` and `length` are then
    unused, and no mask is drawn (pass `attn_mask`).

    Each backend runs twice: with autograd (output and gradients checked) and under
    torch.no_grad (output checked: a backend may serve it by other, forward-only kernels).

    backends: names to check (each one `list_backends(mechanism)` gives, else ValueError), each
    must serve at least one of the two calls without a drawn mask (else UnsupportedCallError);
    default: every name `list_backends(mechanism)` gives,
    those that serve neither reported as skipped. Returns {backend: its first "ok" over the
    calls, or "ok (refused with grad: <reason>)" where only the call without grad is served,
    else "skipped: <reason>"}; raises AssertionError on a disagreement.
    """
    check_mechanism_call(batch, length, dtype, any_length=True)
    if backends is not None:
        check_names("backends", backends, ["auto", *list_backends(mechanism)])
    for i, kind in enumerate(masks):
        check_mechanism_mask(kind, f"masks[{i}]")
    if length is None and shape is None and (attn_mask is not None or symbols is not None):
        raise ValueError("attn_mask and symbols are for one length: pass length= too")
    torch.manual_seed(seed)
    module = build(mechanism, backend="naive", **kwargs).eval().to(dtype)
    call = {"is_causal": is_causal}
    if symbols is not None:
        call["symbols"] = symbols
    if shape is not None or attn_mask is not None:
        given = tuple(shape) if shape is not None else (batch, length, kwargs["d_model"])
        call["attn_mask"] = attn_mask
        return _agree(mechanism, kwargs, module, given, call, None, dtype, backends, seed)
    lengths = [length] if length is not None else mechanism_lengths(module)
    merged: dict[str, str] = {}  # each backend's first "ok" over the calls, else its first
    for n, kind in drawn_calls(lengths, masks, seed):
        call["attn_mask"] = mechanism_mask(kind, batch, n, torch.Generator().manual_seed(seed))
        drawn = None if kind == "none" else kind
        inputs = (batch, n, kwargs["d_model"])
        report = _agree(mechanism, kwargs, module, inputs, call, drawn, dtype, backends, seed)
        for name, status in (report or {}).items():
            ok_now = status.startswith("ok") and not merged.get(name, "").startswith("ok")
            if name not in merged or ok_now:
                merged[name] = status
    return merged


def float64_copy(
    mechanism: str, kwargs: Mapping, module: AttentionMechanism, seed: int
) -> AttentionMechanism:
    """`module` (built from `mechanism` and `kwargs` after ``torch.manual_seed(seed)``) as a
    float64 module of its own: built again and given its state, so that what it holds in
    closures (a score mod reading ``self.slope``) is its own (copy.deepcopy shares a closure's
    ``self`` with the original, whose parameter then took the reference's gradient)."""
    torch.manual_seed(seed)
    reference = build(mechanism, backend="naive", **kwargs).eval().double()
    reference.load_state_dict(module.state_dict())
    return reference


def _agree(
    mechanism: str,
    kwargs: Mapping,
    module: AttentionMechanism,
    shape: tuple[int, ...],
    call: dict,
    drawn: str | None,
    dtype: torch.dtype,
    backends: Sequence[str] | None,
    seed: int,
) -> dict[str, str] | None:
    """The check on one input of `shape` and one `call` (its mask drawn of kind `drawn`, or
    given): {backend: status}; None where the mechanism refuses a drawn mask."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    floats = [k for k, v in call.items() if torch.is_tensor(v) and v.is_floating_point()]
    call = {**call, **{k: call[k].to(dtype) for k in floats}}  # float masks too: in `dtype`
    module.backend = "naive"
    reference = float64_copy(mechanism, kwargs, module, seed)
    ref_call = {**call, **{k: call[k].double() for k in floats}}
    cotangent = cotangent_from(gen)
    try:
        want = _outputs_and_grads(reference, x.double(), cotangent, **ref_call)
    except (ValueError, UnsupportedCallError):
        if drawn is None:
            raise
        return None  # a mask the mechanism does not take
    floor = _outputs_and_grads(module, x, cotangent, **call)  # `dtype`'s own error

    want[PLAIN], floor[PLAIN] = want["output"], floor["output"]
    bounds = {key: floor_bound(key, ref.detach(), dtype) for key, ref in want.items()}
    widen = {}  # twice naive's own error, up to its bound (a naive run that overflowed: none)
    for key, ref in want.items():
        spent = compare(key, floor[key], ref, 0.0, 0.0).max_abs
        widen[key] = 2 * min(spent, bounds[key]) if math.isfinite(spent) else 0.0
    report = {}
    for name in backends if backends is not None else list_backends(mechanism):
        module.backend = name
        got, refused = {}, {}
        try:  # with autograd: outputs and every gradient
            got |= floor if name == "naive" else _outputs_and_grads(module, x, cotangent, **call)
        except UnsupportedCallError as err:
            refused["with grad"] = err
        try:  # without: a backend may pick other kernels (forward-only ones) for it
            with torch.no_grad():
                got[PLAIN] = module(x, **call)
        except UnsupportedCallError as err:
            refused["without grad"] = err
        if len(refused) == 2:
            if backends is not None and drawn is None:
                raise refused["with grad"]
            report[name] = f"skipped: {refused['with grad']}"
            continue
        checked = {key: tensor for key, tensor in want.items() if key in got}
        if failures := disagreements(checked, got, dtype, bounds if name == "naive" else widen):
            if name == "naive":
                failures.append(
                    f"naive's own {dtype} run may be off its float64 run by at most "
                    f"{FLOOR_BOUND:g} (atol + rtol max|want|) on a tensor (the bound of the "
                    f"floor, attn_zoo/testing/mechanisms.py): more is a wrong {dtype} path"
                )
            mask = call["attn_mask"]
            masked = "none" if mask is None else f"{drawn or 'given'} {tuple(mask.shape)}"
            raise AssertionError(
                f"mechanism {mechanism!r} backend {name!r} disagrees with the float64 naive "
                f"reference ({dtype}):\n  " + "\n  ".join(failures) + f"\nkwargs: {dict(kwargs)}, "
                f"input {tuple(x.shape)}, causal {call['is_causal']}, mask {masked}, seed {seed}"
            )
        report[name] = "ok" + "".join(f" (refused {how}: {err})" for how, err in refused.items())
    return report
