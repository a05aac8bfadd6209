"""The relational attention kernel family (Altabaa & Lafferty, arXiv 2405.16727).

    relational_attention(q, k, qr, kr, v=None, v_rel=None, attn_mask=None, is_causal=False,
                         scale=None, rel_scale=None, rel_activation="identity", dropout_p=0.0,
                         backend="auto") -> (B, H, N, hd + R)

q (B, H, N, dk) and k (B, Hkv, M, dk) give the attention; qr (B, R, N, dr) and kr (B, R, M, dr)
the relations r_ij^l = act(rel_scale <qr_i^l, kr_j^l>); the symbol values are either absolute,
v (B, Hkv, M, hd), or relative, v_rel (Hkv, 2K+1, hd) read at clip(j - i, -K, K) + K. The
result holds the attended symbols (hd) and the attended relations (R) of each head; see
naive.py for the math. Masks, causal alignment and empty rows follow the softmax family.
"""

import torch

from attn_zoo.kernels.dispatch import Call, Capabilities, family, register_backend
from attn_zoo.kernels.relational.activations import REL_ACTIVATIONS
from attn_zoo.kernels.relational.chunked import chunked
from attn_zoo.kernels.relational.cpp import cpp, cpp_missing
from attn_zoo.kernels.relational.naive import naive
from attn_zoo.kernels.relational.triton import triton_missing, triton_relational
from attn_zoo.kernels.relational.value_augmentation import value_augmentation
from attn_zoo.kernels.softmax import check_mask

FEATURES = frozenset(
    {"grad", "mask", "causal", "dropout", "gqa", "rel_activation", "relative_symbols"}
)
RELATIONAL = family("relational")
register_backend(
    "relational", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES)
)(naive)
# On CPU the tiled kernel beats value augmentation at every N measured (512..4096, d_model 512,
# 4 heads: 0.42x vs 0.59x the reference's time at N=2048); on CUDA the SDPA kernels should win.
register_backend(
    "relational",
    "chunked",
    tier="chunked",
    priority={"cpu": 40, "cuda": 10},
    capabilities=Capabilities(FEATURES),
)(chunked)
# The C++ kernel (compiled on first use) is the fastest on CPU where it builds; see cpp.py.
register_backend(
    "relational",
    "cpp",
    tier="fused",
    priority={"cpu": 50},
    available=cpp_missing,
    capabilities=Capabilities(
        frozenset({"grad", "causal", "gqa"}),
        devices=frozenset({"cpu"}),
        dtypes=frozenset({torch.float32}),
        why={
            "cuda": "the C++ kernel runs on CPU; on CUDA 'sdpa' and 'triton' serve",
            "mask": "the C++ kernel takes no attn_mask (causal only)",
            "dropout": "the C++ kernel has no dropout",
            "rel_activation": "the C++ kernel computes identity rel_activation only",
            "relative_symbols": "the C++ kernel reads absolute symbol values v, not v_rel",
        },
    ),
)(cpp)
# Value augmentation on torch SDPA: the fused kernel on CUDA until `triton` has been timed there.
register_backend(
    "relational",
    "sdpa",
    tier="fused",
    priority=30,
    capabilities=Capabilities(
        FEATURES - {"rel_activation", "relative_symbols"},
        why={
            "rel_activation": "value augmentation is exact only for identity rel_activation",
            "relative_symbols": "value augmentation needs absolute symbols",
        },
    ),
)(value_augmentation)
# Flash-style Triton kernels (CUDA). Below chunked on CUDA for `auto` until the compiled kernel has
# been checked and timed on a GPU; ask for it by name.
register_backend(
    "relational",
    "triton",
    tier="fused",
    priority=5,
    available=triton_missing,
    capabilities=Capabilities(
        FEATURES - {"dropout", "relative_symbols"},
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        why={
            "cpu": "Triton kernels need a CUDA GPU (on CPU only the Triton interpreter runs them, "
            "for tests)",
            "dropout": "the Triton kernel has no dropout",
            "relative_symbols": "the Triton kernel reads absolute symbol values v, not v_rel",
        },
    ),
)(triton_relational)


def describe_call(
    q, k, qr, kr, v=None, v_rel=None, attn_mask=None, is_causal=False, scale=None,
    rel_scale=None, rel_activation="identity", dropout_p=0.0,
) -> Call:  # fmt: skip
    """The `Call` a relational attention call makes (for backend choice)."""
    tensors = [t for t in (q, k, qr, kr, v, v_rel) if t is not None]
    needs = {
        "grad": torch.is_grad_enabled() and any(t.requires_grad for t in tensors),
        "mask": attn_mask is not None,
        "causal": is_causal,
        "dropout": dropout_p > 0,
        "gqa": k.shape[1] != q.shape[1],
        "rel_activation": rel_activation != "identity",
        "relative_symbols": v_rel is not None,
    }
    return Call(q.device.type, q.dtype, frozenset(f for f, used in needs.items() if used))


RELATIONAL.describe = describe_call


def _check_inputs(q, k, qr, kr, v, v_rel, rel_activation, dropout_p):
    for name, t in (("q", q), ("k", k), ("qr", qr), ("kr", kr)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
    b, h, n, dk = q.shape
    hkv, m = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[-1] != dk or h % hkv:
        raise ValueError(f"k {tuple(k.shape)} does not fit q {tuple(q.shape)}: same batch and "
                         f"width, kv heads dividing {h}")  # fmt: skip
    if qr.shape[0] != b or qr.shape[2] != n or kr.shape != (b, qr.shape[1], m, qr.shape[3]):
        raise ValueError(f"qr {tuple(qr.shape)} / kr {tuple(kr.shape)} must be (B, R, N, dr) / "
                         f"(B, R, M, dr) with B={b}, N={n}, M={m}")  # fmt: skip
    if (v is None) == (v_rel is None):
        raise ValueError("give exactly one of v (absolute symbols) and v_rel (relative symbols)")
    if v is not None and v.shape[:3] != (b, hkv, m):
        raise ValueError(f"v {tuple(v.shape)} must be (B, Hkv, M, hd) = ({b}, {hkv}, {m}, hd)")
    if v_rel is not None and (v_rel.dim() != 3 or v_rel.shape[0] != hkv or v_rel.shape[1] % 2 == 0):
        raise ValueError(f"v_rel {tuple(v_rel.shape)} must be (Hkv, 2K+1, hd) with Hkv={hkv}")
    if rel_activation not in REL_ACTIVATIONS:
        raise ValueError(f"rel_activation={rel_activation!r}: valid are {sorted(REL_ACTIVATIONS)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p}: must be in [0, 1)")


def relational_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    qr: torch.Tensor,
    kr: torch.Tensor,
    v: torch.Tensor | None = None,
    v_rel: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    rel_scale: float | None = None,
    rel_activation: str = "identity",
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Relational attention by the named backend (see module docstring); (B, H, N, hd + R)."""
    _check_inputs(q, k, qr, kr, v, v_rel, rel_activation, dropout_p)
    mask = check_mask(attn_mask, q, k)
    kwargs = dict(
        q=q, k=k, qr=qr, kr=kr, v=v, v_rel=v_rel, attn_mask=mask, is_causal=is_causal,
        scale=scale, rel_scale=rel_scale, rel_activation=rel_activation, dropout_p=dropout_p,
    )  # fmt: skip
    return RELATIONAL.select(backend, describe_call(**kwargs)).fn(**kwargs)
