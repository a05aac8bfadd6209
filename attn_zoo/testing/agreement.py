"""Compare kernel backends against the float64 naive reference, outputs and gradients.

The reference runs in float64 on the very values the backend sees (the problem's inputs in the
backend's dtype, cast up for the reference); gradients are taken for one random cotangent.
Each backend runs twice on new inputs laid out as the problem says (maybe not contiguous): once
under torch.no_grad() with inputs not requiring grad (the inference path), once with autograd
(output and the gradients of the inputs requiring grad: all but those the problem holds ``frozen``,
e.g. q alone, as with a frozen encoder's k and v), and both outputs are compared. Each run must also
keep the kernel contract: an output of the reference's shape in q's dtype on q's device, and every
tensor the kernel was given (q, k, v, the mask, ...) unchanged after the call (same dtype, shape and
values; in-place damage to a caller's tensor is a failure, even where the result is right).
Tolerances per dtype fit the measured error of correct kernels:

    float64  atol 1e-10 rtol 1e-8     float32   atol 1e-5 rtol 1e-4 (grads atol 5e-5)
    float16  atol 1e-2  rtol 5e-3     bfloat16  atol 5e-2 rtol 2e-2

and a NaN or inf anywhere fails. Every call has dropout_p = 0: dropout is not checked
(docs/testing_kit.md). A failure names the backend, the tensor, the worst element
(index, got, want) and the problem, which Hypothesis then shrinks. Everything runs with the
problem's torch thread count (its ``threads``, if it has one).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import torch
from hypothesis import reject
from hypothesis.control import currently_in_test_context

from attn_zoo.kernels.dispatch import family
from attn_zoo.testing.problems import check_names, torch_threads

OUTPUT_TOLERANCE = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (1e-2, 5e-3),
    torch.bfloat16: (5e-2, 2e-2),
}
GRAD_TOLERANCE = {**OUTPUT_TOLERANCE, torch.float32: (5e-5, 1e-4)}
NO_SCORE_MOD = "the problem has a score mod, which this kernel does not declare (score_mod)"


@dataclass(frozen=True)
class Comparison:
    """The worst element of one tensor against the reference."""

    name: str
    max_abs: float
    index: tuple[int, ...]
    got: float
    want: float
    ok: bool

    def message(self, atol: float, rtol: float) -> str:
        return (
            f"{self.name}: max abs err {self.max_abs:.3g}, worst at {self.index}: "
            f"got {self.got:.6g}, want {self.want:.6g} (atol {atol:g}, rtol {rtol:g})"
        )


def compare(name: str, got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float):
    """Check |got - want| <= atol + rtol |want| elementwise and got finite; the worst element."""
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != reference {tuple(want.shape)}")
    got, want = got.detach().to(torch.float64), want.detach().to(torch.float64)
    if got.numel() == 0:
        return Comparison(name, 0.0, (), 0.0, 0.0, True)
    err = (got - want).abs()
    excess = torch.where(got.isfinite(), err - (atol + rtol * want.abs()), float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(excess.argmax(), err.shape))
    max_abs = float(err.max()) if bool(got.isfinite().all()) else float("inf")
    return Comparison(
        name, max_abs, index, float(got[index]), float(want[index]), bool(excess.max() <= 0)
    )


def tolerance(key: str, dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) of tensor `key` in `dtype`: an "output .." key takes the output
    tolerance, any other the gradient one (see module)."""
    return (OUTPUT_TOLERANCE if key.startswith("output") else GRAD_TOLERANCE)[dtype]


def disagreements(
    want: Mapping, got: Mapping, dtype: torch.dtype, widen: Mapping[str, float] | None = None
) -> list[str]:
    """One message per tensor of `got` outside the `dtype` tolerance of `want` (`tolerance`),
    each tensor's atol grown by ``widen[key]`` (none if absent: the mechanism kit's bounded
    floor, see `attn_zoo.testing.mechanisms`)."""
    messages = []
    for key, ref in want.items():
        atol, rtol = tolerance(key, dtype)
        atol += (widen or {}).get(key, 0.0)
        c = compare(key, got[key], ref, atol, rtol)
        if not c.ok:
            messages.append(c.message(atol, rtol))
    return messages


def cast_inputs(
    inputs: Mapping, dtype: torch.dtype, grads: bool, frozen: Collection[str] = ()
) -> dict:
    """The float tensors of `inputs` detached and cast to `dtype` (one already in `dtype` keeps
    its memory layout; a float mask to the wider of `dtype` and its own: a float32 one stays
    float32 beside half inputs), requiring grad if `grads`, but those named in `frozen` (a
    float mask is a constant: no gradient)."""
    return {
        k: v.detach()
        .to(torch.promote_types(dtype, v.dtype) if k == "attn_mask" else dtype)
        .requires_grad_(grads and k != "attn_mask" and k not in frozen)
        if torch.is_tensor(v) and v.is_floating_point()
        else v
        for k, v in inputs.items()
    }


Cotangent = Callable[[torch.Size], torch.Tensor]


def cotangent_from(gen: torch.Generator, device: str | torch.device = "cpu") -> Cotangent:
    """shape -> the float64 standard normal tensor of that shape `gen` would draw next (the
    same at every call; `gen` itself is not advanced), on `device`: the vector the gradients
    are taken against."""
    state = gen.get_state()
    return lambda shape: torch.randn(
        shape, generator=torch.Generator().set_state(state), dtype=torch.float64
    ).to(device)


def outputs_and_grads(
    fn: Callable, inputs: Mapping, cotangent: Cotangent | None
) -> tuple[dict, list[str]]:
    """{"output": fn(**inputs)} plus {"grad <name>": ...} of the inputs requiring grad, for
    the output's `cotangent`; and the names of those inputs the output's autograd graph does
    not reach (every one, where the output has no graph), whose gradient is then zero. With
    no `cotangent`, `fn` runs under torch.no_grad() (nothing unreached)."""
    leaves = {k: v for k, v in inputs.items() if torch.is_tensor(v) and v.requires_grad}
    with torch.set_grad_enabled(cotangent is not None):
        out = fn(**inputs)
    result = {"output": out}
    if cotangent is None or not leaves:
        return result, []
    vector = cotangent(out.shape).to(out.dtype)
    if out.requires_grad:
        got = torch.autograd.grad(out, list(leaves.values()), vector, allow_unused=True)
    else:
        got = (None,) * len(leaves)
    for (k, leaf), g in zip(leaves.items(), got, strict=True):
        result[f"grad {k}"] = torch.zeros_like(leaf) if g is None else g
    return result, [k for k, g in zip(leaves, got, strict=True) if g is None]


def unreached_note(unreached: list[str], out: torch.Tensor) -> list[str]:
    """A line for a failure where the gradients of the inputs `unreached` were taken as zeros:
    why (the output `out` has no autograd graph, or one that misses them), and the fix."""
    if not unreached:
        return []
    names = ", ".join(unreached)
    why = (
        "the output carries no autograd graph (computed under torch.no_grad, through NumPy "
        "or by an extension without a backward)"
        if not out.requires_grad
        else f"the output's autograd graph does not reach {names} (ignored, or used outside "
        "autograd)"
    )
    return [
        f"no gradient for {names} (compared as zeros): {why}. Give the kernel a backward "
        "(a torch.autograd.Function), or check its forward only: grads=False"
    ]


def changed_in_place(before: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> list[str]:
    """One message per tensor of `before` ({name: (tensor, its copy when the call began)})
    whose dtype, shape or values are no longer its copy's."""
    messages = []
    for name, (now, was) in before.items():
        if now.dtype != was.dtype or now.shape != was.shape:
            messages.append(
                f"{name} changed in place: {was.dtype} {tuple(was.shape)} became "
                f"{now.dtype} {tuple(now.shape)}"
            )
        elif not torch.equal(now.detach(), was):
            messages.append(f"{name} changed in place: its values differ after the call")
    return messages


def broken_contract(out: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, device) -> list:
    """A message if `out` is not of `want`'s shape, in `dtype` on `device`."""
    if (out.shape, out.dtype, out.device) == (want.shape, dtype, device):
        return []
    return [
        f"output is {out.dtype} {tuple(out.shape)} on {out.device}; the contract is {dtype} "
        f"{tuple(want.shape)} on {device} (q's dtype and device, the reference's shape)"
    ]


def assert_backends_agree(
    problem,
    family_name: str = "softmax",
    backends: Sequence[str] | None = None,
    kernels: Mapping[str, Callable] | None = None,
    grads: bool = True,
    kernel_features: Collection[str] = frozenset(),
    device: str = "cpu",
) -> dict[str, str]:
    """Check backends of kernel family `family_name` against its float64 ``naive`` backend.

    problem:  anything with ``.dtype`` and ``.inputs(dtype)`` -> the kernel's kwargs, new
              tensors each call (e.g. `attn_zoo.testing.AttentionProblem`); its ``threads``
              (optional) sets torch's thread count for the whole check, and its ``frozen``
              (optional) names the inputs given without requires_grad (their gradients not
              compared; the others' are, as a frozen encoder's k and v leave q's).
    backends: names to check (the family's, else ValueError); each must serve the problem
              (else UnsupportedCallError), but for a drawn score mod, which one that does not
              declare ``score_mod`` cannot run: reported skipped (a mask mod reaches it as a
              mask). Default: every registered backend that serves it; the rest are reported
              skipped.
    kernels:  extra functions with the family's signature, checked too (name -> fn), e.g. a
              kernel under development that is not registered. Every kernel gets the inputs
              as the family passes them to a backend declaring `kernel_features`: checked,
              the mask 4-D (boolean or additive float), causality top-left (a bottom-right
              call arrives as a mask, unless ``bottom_right`` is declared).
    grads:    also run with autograd and compare that output and the gradients of every tensor
              input not ``frozen``; the run without grad (torch.no_grad(), inputs not requiring
              grad) is checked either way.
    kernel_features: the features the `kernels` declare (registered backends: their own),
              each one that a backend of the family declares (else ValueError); a problem
              with a score mod skips the kernels unless it holds ``score_mod``.
    device:   where every kernel and the reference run (e.g. "cuda": the problem's
              ``inputs(dtype, device)`` builds the tensors there).

    Returns {name: "ok" or "skipped: <reason>"}; raises AssertionError on a disagreement, an
    output of another dtype, shape or device, or an input changed in place (see module). A
    gradient the kernel's autograd graph does not give (no graph at all: a kernel run under
    torch.no_grad or outside torch) is compared as zeros, and a failure then says so.
    """
    with torch_threads(getattr(problem, "threads", None)):
        return _agree(problem, family_name, backends, kernels, grads, kernel_features, device)


def _agree(
    problem, family_name, backends, kernels, grads, kernel_features, device
) -> dict[str, str]:
    fam = family(family_name)
    declared = {f for backend in fam.backends.values() for f in backend.capabilities.features}
    check_names("kernel_features", kernel_features, declared)
    if backends is not None:
        check_names("backends", backends, ["auto", *fam.names()])
        if not backends and not kernels:
            raise ValueError(
                "backends=[] and no kernels: nothing to check (name backends, pass kernels, "
                "or leave backends unset for every registered one that serves the problem)"
            )
    dtype = problem.dtype
    on = torch.empty(0, device=device).device  # "cuda" -> cuda:0, as tensors report it

    frozen = getattr(problem, "frozen", ())  # inputs that require no grad: none compared

    def fresh(requires_grad: bool) -> dict:
        """New inputs of the problem in `dtype`, laid out as it says, requiring grad if
        `requires_grad` (but those `frozen`)."""
        drawn = problem.inputs(dtype, device) if device != "cpu" else problem.inputs(dtype)
        return cast_inputs(drawn, dtype, requires_grad, frozen)

    def checked(kernel: Callable, features: Collection[str], given: list | None = None):
        """`kernel` on the inputs as the family passes them to a backend with `features`;
        each call appends {name: (tensor, its copy)} of what the kernel got to `given`."""
        features = frozenset(features)

        def call(**inputs):
            lowered = fam.backend_inputs(fam.check(**inputs), features)
            if given is not None:
                given.append(
                    {k: (t, t.detach().clone()) for k, t in lowered.items() if torch.is_tensor(t)}
                )
            return kernel(**lowered)

        return call

    naive = fam.backends["naive"]
    reference = checked(naive.fn, naive.capabilities.features)
    ref_inputs = cast_inputs(fresh(False), torch.float64, grads, frozen)
    seed = getattr(problem, "seed", 0)
    cotangent = cotangent_from(torch.Generator().manual_seed(seed), device) if grads else None
    want, _ = outputs_and_grads(reference, ref_inputs, cotangent)
    # the output without grad against the same reference; with grads, the autograd run's too
    expected = {"output (no grad)": want["output"], **(want if grads else {})}

    with torch.set_grad_enabled(grads):
        call = fam.describe(**fam.check(**fresh(grads)))
    modded = "score_mod" in call.features  # only a backend declaring it can run the call
    report: dict[str, str] = {}
    to_check: dict[str, tuple[Callable, Collection[str]]] = {}
    for name, fn in (kernels or {}).items():
        if modded and "score_mod" not in kernel_features:
            report[name] = f"skipped: {NO_SCORE_MOD}"
        else:
            to_check[name] = (fn, kernel_features)
    for name in backends if backends is not None else list(fam.backends):
        registered = fam.backends.get(name)
        lacks_mod = registered is not None and "score_mod" not in registered.capabilities.features
        if backends is None and (reason := registered.refusal(call)) is not None:
            report[name] = f"skipped: {reason}"
        elif modded and lacks_mod:
            report[name] = f"skipped: {NO_SCORE_MOD}"
        else:
            chosen = fam.select(name, call) if backends is not None else registered
            to_check[name] = (chosen.fn, chosen.capabilities.features)

    if not to_check:  # every kernel asked for was skipped: a check that could not fail
        if currently_in_test_context():
            reject()  # under @given: another problem is drawn (all rejected: Unsatisfiable)
        raise AssertionError(
            "nothing was compared on this problem: "
            + "; ".join(f"{name} {why}" for name, why in report.items())
            + f"\nProblem: {problem!r}"
        )

    def fail(name: str, what: str, failures: list[str]):
        raise AssertionError(
            f"{family_name} backend {name!r} {what} ({dtype}):\n  " + "\n  ".join(failures)
            + f"\nProblem: {problem!r}"
        )  # fmt: skip

    for name, (fn, features) in to_check.items():
        got = {}
        for cot in (None, cotangent) if grads else (None,):  # no grad, then autograd
            given: list[dict] = []
            run = checked(fn, features, given)
            result, unreached = outputs_and_grads(run, fresh(cot is not None), cot)
            if broken := broken_contract(result["output"], want["output"], dtype, on):
                fail(name, "breaks the kernel contract", broken)
            if changed := [m for seen in given for m in changed_in_place(seen)]:
                fail(name, "changes its inputs in place", changed)
            got.update(result if cot is not None else {"output (no grad)": result["output"]})
        if failures := disagreements(expected, got, dtype):
            failures += unreached_note(unreached, result["output"])
            fail(name, "disagrees with the float64 naive reference", failures)
        report[name] = "ok"
    return report
