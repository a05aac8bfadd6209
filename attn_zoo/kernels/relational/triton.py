"""Relational attention as Triton kernels: flash-style forward and backward (CUDA). The kernels,
their math and tiling: triton_kernels.py, imported by the first launch (not by `import attn_zoo`:
importing triton costs about 0.3 s of CPU).

Supports grad, causal, boolean attn_mask, grouped-query heads and every rel_activation, in
float32 (dots in IEEE fp32, no TF32), float16 and bfloat16 (dots in the input dtype, fp32
accumulation). No dropout, no relative symbols (v_rel). Tiles are BLOCK x BLOCK; widths and head
/ relation counts are padded to powers of two (widths to at least 16, the smallest dot).
Without CUDA the kernels run only under the Triton interpreter (TRITON_INTERPRET=1 set before
triton is first imported), which is how the tests check them on CPU.

The launches are two torch custom ops, attn_zoo::relational_triton_forward -> (out, lse, rlse)
and attn_zoo::relational_triton_backward -> (dq, dk, dv, dqr, dkr), with fake kernels (output
shapes, dtypes, contiguous layout) and the autograd formula registered: torch.compile(
fullgraph=True) traces a call as one opaque op each way (inductor calls them as extern kernels,
it does not fuse into the Triton code).
"""

from __future__ import annotations

import contextlib
import functools
from types import ModuleType

import torch

from attn_zoo.kernels.dispatch import Capabilities, constant_when_compiled, register_backend
from attn_zoo.kernels.relational.family import FEATURES
from attn_zoo.kernels.relational.naive import default_scales

BLOCK = 16  # query and key tile length


@constant_when_compiled  # traced code takes the answer as a constant (Dynamo would trace a cache)
def triton_missing() -> str | None:
    """None if triton imports (importing it on the first call), else why not. Dispatch asks
    only for a call on CUDA: the backend's devices refuse a CPU call first (dispatch.py)."""
    return _import_triton()


@functools.cache  # one import attempt per process
def _import_triton() -> str | None:
    """Imports triton: None, or why it does not import."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return f"triton is not installed (pip install triton): {err}"
    return None


def _kernels() -> ModuleType:
    """The kernels (triton_kernels.py), imported with triton by the first launch."""
    from attn_zoo.kernels.relational import triton_kernels

    return triton_kernels


@constant_when_compiled  # traced code takes the answer as a constant
def _interpreted() -> bool:
    """Whether the kernels run under the Triton interpreter (TRITON_INTERPRET=1 set before triton
    is first imported)."""
    return type(_kernels().forward).__name__ == "InterpretedFunction"


def _on_device_of(t: torch.Tensor):
    """Launch on t's GPU (Triton launches on the current device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


class _Launch:
    """Grid arguments shared by the three kernels of one call."""

    def __init__(self, q, k, v, qr, mask, is_causal, scale, rel_scale, act, block):
        import triton  # by the first launch, with the kernels (`_kernels`)

        (self.b, self.h, self.n, dk), (self.hkv, self.m) = q.shape, k.shape[1:3]
        r, dr, hd = qr.shape[1], qr.shape[3], v.shape[3]
        # (tiles along N or M, B): a program per query tile or per key tile, per batch element
        self.query_grid = (triton.cdiv(self.n, block), self.b)
        self.key_grid = (triton.cdiv(self.m, block), self.b)
        self.mask, strides = q, (0, 0, 0, 0)  # a dummy pointer: HAS_MASK=False never reads it
        if mask is not None:  # broadcast dims get stride 0
            self.mask = mask.to(torch.uint8).expand(self.b, self.h, self.n, self.m)
            strides = self.mask.stride()
        self.scalars = (self.n, self.m, self.h, self.hkv, scale, rel_scale, *strides)
        power_of_2 = triton.next_power_of_2
        self.meta = dict(  # widths padded to at least 16, the smallest dot
            R=r, R_P=power_of_2(r), H_P=power_of_2(self.h),
            D_K=dk, D_KP=max(16, power_of_2(dk)), D_V=hd, D_VP=max(16, power_of_2(hd)),
            D_R=dr, D_RP=max(16, power_of_2(dr)),
            BLOCK_M=block, BLOCK_N=block, CAUSAL=is_causal, HAS_MASK=mask is not None, ACT=act,
            DOT="tf32" if q.dtype in (torch.float16, torch.bfloat16) else "ieee",  # fp32: no tf32
        )  # fmt: skip
        # every head's accumulators live in registers: 8 warps where 4 would spill (ptxas
        # reports of sm_80 builds; not timed)
        heads_width = self.meta["H_P"] * max(self.meta["D_KP"], self.meta["D_VP"])
        self.meta["num_warps"] = 4 if heads_width <= 128 else 8


# The kernels as torch custom ops (forward and backward), with fake kernels and the autograd
# formula registered, so torch.compile(fullgraph=True) traces a call as one opaque op each way
# (inductor calls them as extern kernels). Their bodies launch the kernels and are never traced.
# rlse (the relation row logsumexp) is an output of its own even where the activation does not
# use it: outputs of a custom op may not alias one another.


@torch.library.custom_op("attn_zoo::relational_triton_forward", mutates_args=())
def _forward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qr: torch.Tensor,
    kr: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    rel_scale: float,
    act: str,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (B, H, N, hd + R) in q's dtype, lse (B, H, N), rlse (B, R, N)) from contiguous
    q, k, v, qr, kr of one dtype; lse and rlse float32."""
    q, k, v, qr, kr = (t.contiguous() for t in (q, k, v, qr, kr))
    run = _Launch(q, k, v, qr, attn_mask, is_causal, scale, rel_scale, act, block)
    b, h, n, r = run.b, run.h, run.n, qr.shape[1]
    o_sym = q.new_empty(b, h, n, v.shape[3])
    o_rel = q.new_empty(b, h, n, r)
    lse = q.new_empty(b, h, n, dtype=torch.float32)
    # written by the softmax activation only; zeros otherwise, so that the output is defined
    rlse = (q.new_empty if act == "softmax" else q.new_zeros)(b, r, n, dtype=torch.float32)
    with _on_device_of(q):
        _kernels().forward[run.query_grid](
            q, k, v, qr, kr, run.mask, o_sym, o_rel, lse, rlse, *run.scalars, **run.meta
        )
    return torch.cat([o_sym, o_rel], dim=-1), lse, rlse


@_forward_op.register_fake
def _(q, k, v, qr, kr, attn_mask, is_causal, scale, rel_scale, act, block):
    (b, h, n, _), r = q.shape, qr.shape[1]
    out = q.new_empty(b, h, n, v.shape[3] + r)
    f32 = dict(dtype=torch.float32)
    return out, q.new_empty(b, h, n, **f32), q.new_empty(b, r, n, **f32)


@torch.library.custom_op("attn_zoo::relational_triton_backward", mutates_args=())
def _backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qr: torch.Tensor,
    kr: torch.Tensor,
    attn_mask: torch.Tensor | None,
    do_sym: torch.Tensor,
    do_rel: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    rlse: torch.Tensor,
    row_term: torch.Tensor,
    is_causal: bool,
    scale: float,
    rel_scale: float,
    act: str,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dqr, dkr), each in its input's dtype and shape. do_sym (B, H, N, hd) in
    v's dtype, do_rel (B, H, N, R), delta (B, H, N) and row_term (B, R, N) float32 (row_term
    is read by the softmax activation only)."""
    q, k, v, qr, kr, do_sym, do_rel, lse, delta, rlse, row_term = (
        t.contiguous() for t in (q, k, v, qr, kr, do_sym, do_rel, lse, delta, rlse, row_term)
    )
    run = _Launch(q, k, v, qr, attn_mask, is_causal, scale, rel_scale, act, block)
    hd = v.shape[3]
    f32 = dict(dtype=torch.float32)
    dq, dqr, dkr = (t.new_empty(t.shape, **f32) for t in (q, qr, kr))
    dk = k.new_empty(run.b, run.h, run.m, k.shape[3], **f32)  # per query head
    dv = v.new_empty(run.b, run.h, run.m, hd, **f32)
    shared = (q, k, v, qr, kr, run.mask, do_sym, do_rel, lse, delta, rlse, row_term)
    with _on_device_of(q):
        kernels = _kernels()
        kernels.backward_queries[run.query_grid](*shared, dq, dqr, *run.scalars, **run.meta)
        kernels.backward_keys[run.key_grid](*shared, dk, dv, dkr, *run.scalars, **run.meta)
    # (B, H, M, .) -> (B, Hkv, M, .): sum the heads sharing a kv head (explicit sizes: M may be 0)
    dk, dv = (t.unflatten(1, (run.hkv, run.h // run.hkv)).sum(2) for t in (dk, dv))
    grads = zip((dq, dk, dv, dqr, dkr), (q, k, v, qr, kr), strict=True)
    return tuple(g.to(t.dtype) for g, t in grads)


@_backward_op.register_fake
def _(q, k, v, qr, kr, attn_mask, do_sym, do_rel, lse, delta, rlse, row_term, *args):
    return tuple(t.new_empty(t.shape) for t in (q, k, v, qr, kr))


def _setup_context(ctx, inputs, output):
    q, k, v, qr, kr, attn_mask, *ctx.args = inputs
    out, lse, rlse = output
    ctx.save_for_backward(q, k, v, qr, kr, attn_mask, out, lse, rlse)


def _backward(ctx, dout, _dlse, _drlse):
    q, k, v, qr, kr, attn_mask, out, lse, rlse = ctx.saved_tensors
    hd, act = v.shape[3], ctx.args[3]
    do_sym = dout[..., :hd].to(v.dtype).contiguous()
    do_rel = dout[..., hd:].float().contiguous()
    o_sym, o_rel = out[..., :hd], out[..., hd:]
    delta = (do_sym.float() * o_sym.float()).sum(-1) + (do_rel * o_rel.float()).sum(-1)
    row_term = lse  # a placeholder, read by the softmax activation only:
    if act == "softmax":  # sum_j r_ij dr_ij = sum_h drel_hil rel_hil, (B, R, N)
        row_term = (do_rel * o_rel.float()).sum(1).transpose(1, 2).contiguous()
    shared = q, k, v, qr, kr, attn_mask, do_sym, do_rel, lse, delta, rlse, row_term
    grads = _backward_op(*shared, *ctx.args)
    return *grads, None, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


# Flash-style Triton kernels (CUDA). Below chunked on CUDA for `auto` until the compiled kernel has
# been checked and timed on a GPU; ask for it by name.
@register_backend(
    "relational",
    "triton",
    tier="fused",
    priority=5,
    available=triton_missing,
    capabilities=Capabilities(
        FEATURES - {"dropout", "relative_symbols", "float_mask"},
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        why={
            "cpu": "Triton kernels need a CUDA GPU (on CPU only the Triton interpreter runs them, "
            "for tests)",
            "dropout": "the Triton kernel has no dropout",
            "relative_symbols": "the Triton kernel reads absolute symbol values v, not v_rel",
            "float_mask": "the Triton kernel takes boolean masks only",
        },
    ),
    block_sizes=(BLOCK,),
)
def triton_relational(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    qr: torch.Tensor,  # (B, R, N, dr)
    kr: torch.Tensor,  # (B, R, M, dr)
    v: torch.Tensor | None = None,  # (B, Hkv, M, hd)
    v_rel: torch.Tensor | None = None,  # not supported
    attn_mask: torch.Tensor | None = None,  # boolean, broadcastable to (B, H, N, M)
    is_causal: bool = False,
    scale: float | None = None,
    rel_scale: float | None = None,
    rel_activation: str = "identity",
    dropout_p: float = 0.0,
    block: int = BLOCK,
) -> torch.Tensor:  # (B, H, N, hd + R)
    """Relational attention by the Triton kernels (their math: triton_kernels.py)."""
    if why := triton_missing():
        raise RuntimeError(why)
    if not q.is_cuda and not _interpreted():
        raise ValueError(
            f"the triton backend needs CUDA tensors, got {q.device} (on CPU it runs only "
            "under the Triton interpreter: TRITON_INTERPRET=1 before triton is imported)"
        )
    if block < 16 or block & (block - 1):
        raise ValueError(f"block={block}: must be a power of two >= 16")
    scale, rel_scale = default_scales(q, qr, scale, rel_scale)
    if attn_mask is not None and attn_mask.dim() < 4:
        attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    q, k, v, qr, kr = (t.to(q.dtype).contiguous() for t in (q, k, v, qr, kr))
    args = bool(is_causal), float(scale), float(rel_scale), rel_activation, block
    return _forward_op(q, k, v, qr, kr, attn_mask, *args)[0]
