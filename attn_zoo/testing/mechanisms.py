"""Compare a mechanism's backends: same parameters, float64 naive reference.

Outputs, the gradient of the input and of every parameter are compared with the per-dtype
tolerances of `attn_zoo.testing.agreement`, each tensor's atol grown by twice the error the
naive backend itself makes on that tensor in the checked dtype (e = its worst |naive_dtype -
naive_float64|). The whole layer runs in the dtype (parameters, projections, norms, the
kernel), and a parameter's gradient sums B N per-position terms, so the layer's own rounding
can exceed the fixed tolerances for every backend alike: in bfloat16, weight gradients off by
0.1-1.5 (N 9-513; fixed atol 0.05), and even in float32 (gla with fast gates, tau=0.5, N =
130: 1e-3 in gradients of 1e2). Why twice: got - want = (got - naive_dtype) + (naive_dtype -
want); the second term is e, and the first, for a correct backend, is the rounding of the same
sums in another order, of the size of e; so |got - want| <= 2 e plus the fixed tolerances. The
largest share of e a correct backend used, over every registered mechanism and CPU backend
(N 9, 33, 255, 513; three or four seeds each; d_model 16): bfloat16 1.05 (differential on
sdpa, N = 255), float16 0.87, float32 within the fixed tolerances; the chunked gla kernel
stayed within 1 e on 324 float32 problems. A wrong kernel errs by the order of the values
themselves. Modules run in eval mode (no dropout). Without a `length`, every length where one
of its kernels' backends changes is checked (`mechanism_lengths`: 1, 9 and the `block_edges`
of each declared block size), so a backend that mishandles a partial last block cannot pass
on short inputs alone.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch

from attn_zoo.kernels.dispatch import UnsupportedCallError, family
from attn_zoo.mechanisms.base import AttentionMechanism
from attn_zoo.mechanisms.registry import build, list_backends
from attn_zoo.testing.agreement import Cotangent, cotangent_from, disagreements
from attn_zoo.testing.strategies import block_edges


def mechanism_lengths(module: torch.nn.Module) -> list[int]:
    """1, 9 and the `block_edges` of every block size that a backend of a kernel family the
    module (or any mechanism inside it) calls declares, sorted."""
    families = {m.kernel_family for m in module.modules() if isinstance(m, AttentionMechanism)}
    blocks = {b for name in families for b in family(name).block_sizes()}
    return sorted({1, 9, *(n for b in blocks for n in block_edges(b))})


PLAIN = "output without grad"  # the output of the call under torch.no_grad


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
) -> dict[str, str]:
    """Build `mechanism` with `kwargs`, run each backend on one random input (batch, length,
    d_model) and check output and gradients against the float64 ``naive`` backend (atol grown
    by twice the ``naive`` backend's own error in `dtype`: see the module). Without
    `length` (and `shape`), at every length of `mechanism_lengths` in turn (an `attn_mask` or
    `symbols` then needs its `length`).

    shape: the input's shape instead of (batch, length, d_model), for mechanisms whose input
    has another rank or layout (axial attention, MSA attention); `batch` and `length` are then
    unused.

    Each backend runs twice: with autograd (output and gradients checked) and under
    torch.no_grad (output checked: a backend may serve it by other, forward-only kernels).

    backends: names to check, each must serve at least one of the two calls (else
    UnsupportedCallError); default: every name `list_backends(mechanism)` gives, those that
    serve neither reported as skipped. Returns {backend: "ok", "ok (refused with grad:
    <reason>)" where only the call without grad is served, or "skipped: <reason>"}; raises
    AssertionError on a disagreement.
    """
    torch.manual_seed(seed)
    module = build(mechanism, backend="naive", **kwargs).eval().to(dtype)
    if length is None and shape is None:
        if attn_mask is not None or symbols is not None:
            raise ValueError("attn_mask and symbols are for one length: pass length= too")
        call = dict(batch=batch, is_causal=is_causal, dtype=dtype, backends=backends, seed=seed)
        for n in mechanism_lengths(module):
            report = assert_mechanism_backends_agree(mechanism, kwargs, length=n, **call)
        return report
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, kwargs["d_model"]) if shape is None else tuple(shape)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    call = {"attn_mask": attn_mask, "is_causal": is_causal}
    if symbols is not None:
        call["symbols"] = symbols.to(dtype)
    reference = copy.deepcopy(module).double()
    ref_call = {**call, "symbols": call["symbols"].double()} if symbols is not None else call
    cotangent = cotangent_from(gen)
    want = _outputs_and_grads(reference, x.double(), cotangent, **ref_call)
    module.backend = "naive"  # the error of `dtype` itself on this problem: atol grows by 2x it
    floor = _outputs_and_grads(module, x, cotangent, **call)

    want[PLAIN], floor[PLAIN] = want["output"], floor["output"]
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
            if backends is not None:
                raise refused["with grad"]
            report[name] = f"skipped: {refused['with grad']}"
            continue
        checked = {key: tensor for key, tensor in want.items() if key in got}
        if failures := disagreements(checked, got, dtype, floor):
            raise AssertionError(
                f"mechanism {mechanism!r} backend {name!r} disagrees with the float64 naive "
                f"reference ({dtype}):\n  " + "\n  ".join(failures) + f"\nkwargs: {dict(kwargs)}, "
                f"input {tuple(x.shape)}, causal {is_causal}, "
                f"mask {None if attn_mask is None else tuple(attn_mask.shape)}, seed {seed}"
            )
        report[name] = "ok" + "".join(f" (refused {how}: {err})" for how, err in refused.items())
    return report
