"""Compare kernel backends against the float64 naive reference, outputs and gradients.

The reference runs in float64 on the very values the backend sees (inputs drawn in float64,
cast to the backend's dtype, cast back up for the reference); gradients are taken for one
random cotangent. Tolerances per dtype fit the measured error of correct kernels:

    float64  atol 1e-10 rtol 1e-8     float32   atol 1e-5 rtol 1e-4 (grads atol 5e-5)
    float16  atol 1e-2  rtol 5e-3     bfloat16  atol 5e-2 rtol 2e-2

and a NaN or inf anywhere fails. A failure names the backend, the tensor, the worst element
(index, got, want) and the problem, which Hypothesis then shrinks. Everything runs with the
problem's torch thread count (its ``threads``, if it has one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import torch

from attn_zoo.kernels.dispatch import family
from attn_zoo.testing.problems import torch_threads

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


def disagreements(
    want: Mapping, got: Mapping, dtype: torch.dtype, floor: Mapping | None = None
) -> list[str]:
    """One message per tensor of `got` outside the `dtype` tolerance of `want` (see module).
    `floor`: the same tensors by the naive backend run in `dtype`; each tensor's atol then
    grows by that run's own worst error on it (what `dtype` arithmetic costs on the problem)."""
    messages = []
    for key, ref in want.items():
        atol, rtol = (OUTPUT_TOLERANCE if key == "output" else GRAD_TOLERANCE)[dtype]
        spent = 0.0 if floor is None else compare(key, floor[key], ref, 0.0, 0.0).max_abs
        atol += spent if math.isfinite(spent) else 0.0  # a naive run that overflowed: none
        c = compare(key, got[key], ref, atol, rtol)
        if not c.ok:
            messages.append(c.message(atol, rtol))
    return messages


def cast_inputs(inputs: Mapping, dtype: torch.dtype, grads: bool) -> dict:
    """Fresh leaf copies of the float tensors in `inputs`, cast to `dtype` (a float mask is a
    constant: no gradient)."""
    return {
        k: v.detach().to(dtype).requires_grad_(grads and k != "attn_mask")
        if torch.is_tensor(v) and v.is_floating_point()
        else v
        for k, v in inputs.items()
    }


def outputs_and_grads(fn: Callable, inputs: Mapping, cotangent: torch.Tensor | None) -> dict:
    """{"output": fn(**inputs)} plus {"grad <name>": ...} of the inputs requiring grad."""
    leaves = {k: v for k, v in inputs.items() if torch.is_tensor(v) and v.requires_grad}
    with torch.set_grad_enabled(cotangent is not None):
        out = fn(**inputs)
    result = {"output": out}
    if cotangent is not None and leaves:
        got = torch.autograd.grad(out, list(leaves.values()), cotangent.to(out.dtype))
        result.update({f"grad {k}": g for k, g in zip(leaves, got, strict=True)})
    return result


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

    problem:  anything with ``.dtype`` and ``.inputs(dtype)`` -> the kernel's kwargs
              (e.g. `attn_zoo.testing.AttentionProblem`); its ``threads`` (optional) sets
              torch's thread count for the whole check.
    backends: names to check; each must serve the problem (else UnsupportedCallError), but
              for a drawn score mod, which one that does not declare ``score_mod`` cannot
              run: reported skipped (a mask mod reaches it as a mask). Default: every
              registered backend that serves it; the rest are reported skipped.
    kernels:  extra functions with the family's signature, checked too (name -> fn), e.g. a
              kernel under development that is not registered. Every kernel gets the inputs
              as the family passes them to a backend declaring `kernel_features`: checked,
              the mask 4-D (boolean or additive float), causality top-left (a bottom-right
              call arrives as a mask, unless ``bottom_right`` is declared).
    grads:    also compare the gradients of every tensor input.
    kernel_features: the features the `kernels` declare (registered backends: their own);
              a problem with a score mod skips the kernels unless it holds ``score_mod``.
    device:   where every kernel and the reference run (e.g. "cuda": the problem's
              ``inputs(dtype, device)`` builds the tensors there).

    Returns {name: "ok" or "skipped: <reason>"}; raises AssertionError on a disagreement.
    """
    with torch_threads(getattr(problem, "threads", None)):
        return _agree(problem, family_name, backends, kernels, grads, kernel_features, device)


def _agree(
    problem, family_name, backends, kernels, grads, kernel_features, device
) -> dict[str, str]:
    fam = family(family_name)
    dtype = problem.dtype
    drawn = (
        problem.inputs(torch.float64, device) if device != "cpu" else problem.inputs(torch.float64)
    )
    ref_inputs = cast_inputs(cast_inputs(drawn, dtype, False), torch.float64, grads)

    def checked(kernel: Callable, features: Collection[str]) -> Callable:
        """`kernel` on the inputs as the family passes them to a backend with `features`."""
        features = frozenset(features)
        return lambda **inputs: kernel(**fam.backend_inputs(fam.check(**inputs), features))

    naive = fam.backends["naive"]
    reference = checked(naive.fn, naive.capabilities.features)
    cotangent = None
    if grads:
        with torch.no_grad():
            shape = reference(**ref_inputs).shape
        gen = torch.Generator().manual_seed(problem.seed if hasattr(problem, "seed") else 0)
        cotangent = torch.randn(shape, generator=gen, dtype=torch.float64).to(device)
    want = outputs_and_grads(reference, ref_inputs, cotangent)

    with torch.set_grad_enabled(grads):
        call = fam.describe(**fam.check(**cast_inputs(drawn, dtype, grads)))
    modded = "score_mod" in call.features  # only a backend declaring it can run the call
    report: dict[str, str] = {}
    to_check: dict[str, Callable] = {}
    for name, fn in (kernels or {}).items():
        if modded and "score_mod" not in kernel_features:
            report[name] = f"skipped: {NO_SCORE_MOD}"
        else:
            to_check[name] = checked(fn, kernel_features)
    for name in backends if backends is not None else list(fam.backends):
        registered = fam.backends.get(name)
        lacks_mod = registered is not None and "score_mod" not in registered.capabilities.features
        if backends is None and (reason := registered.refusal(call)) is not None:
            report[name] = f"skipped: {reason}"
        elif modded and lacks_mod:
            report[name] = f"skipped: {NO_SCORE_MOD}"
        else:
            chosen = fam.select(name, call) if backends is not None else registered
            to_check[name] = checked(chosen.fn, chosen.capabilities.features)

    for name, fn in to_check.items():
        got = outputs_and_grads(fn, cast_inputs(drawn, dtype, grads), cotangent)
        if failures := disagreements(want, got, dtype):
            raise AssertionError(
                f"{family_name} backend {name!r} disagrees with the float64 naive reference "
                f"({dtype}):\n  " + "\n  ".join(failures) + f"\nProblem: {problem!r}"
            )
        report[name] = "ok"
    return report
