"""The relational kernel family: its inputs, the call they make, the features backends declare.

    q (B, H, N, dk), k (B, Hkv, M, dk): the attention; qr (B, R, N, dr), kr (B, R, M, dr): the
    relations r_ij^l = act(rel_scale <qr_i^l, kr_j^l>); symbol values, exactly one of
    absolute  v (B, Hkv, M, hd)                     value of key j,
    relative  v_rel (Hkv, 2K+1, hd)                 read at clip(j - i, -K, K) + K,
    pairwise  v_pair (Hkv, N, M, hd) or (B, Hkv, N, M, hd)   value of the pair (i, j): the
              projection of the reference's dense (N, N, d_model) symbols s_ij.

Masks and causal alignment as in the softmax family (softmax/masks.py; ``bottom_right``
declared by backends that take bottom-right causality without a mask). Features a call may
need (`describe_call`): ``grad``, ``mask``, ``float_mask``, ``causal``, ``dropout``,
``gqa``, ``rel_activation`` (anything but identity), ``relative_symbols`` (v_rel), ``no_keys``
(M = 0), ``no_queries`` (N = 0), ``pair_symbols`` (v_pair), ``saturated_mask`` (as the softmax
family's: a backward through rows masked by a finite value below -100, float32's min; sdpa's
value augmentation declines it).

``pair_symbols`` is not in FEATURES: backends declare ``FEATURES - {...}`` and must not gain it
unseen. A backend that reads v_pair declares ``FEATURES | PAIR_SYMBOLS``; the family passes
v_pair (a keyword) only to calls that have one, so the other backends never see the name.
"""

import torch

from attn_zoo.kernels.dispatch import Call, define_family
from attn_zoo.kernels.relational.activations import REL_ACTIVATIONS
from attn_zoo.kernels.softmax.family import check_mask
from attn_zoo.kernels.softmax.masks import (
    is_additive,
    lower_bottom_right,
    normal_causality,
    saturated,
)

FEATURES = frozenset(
    {"grad", "mask", "float_mask", "causal", "dropout", "gqa", "rel_activation",
     "relative_symbols", "no_keys", "no_queries", "saturated_mask"}
)  # fmt: skip
PAIR_SYMBOLS = frozenset({"pair_symbols"})


def check_symbol_values(v, v_rel, v_pair, b: int, hkv: int, n: int, m: int) -> None:
    """Exactly one of v, v_rel, v_pair, in its shape (see module docstring)."""
    if sum(t is not None for t in (v, v_rel, v_pair)) != 1:
        raise ValueError(
            "give exactly one of v (absolute symbols), v_rel (relative symbols) and v_pair "
            "(pairwise symbols)"
        )
    if v is not None and (v.dim() != 4 or v.shape[:3] != (b, hkv, m)):
        raise ValueError(f"v {tuple(v.shape)} must be (B, Hkv, M, hd) = ({b}, {hkv}, {m}, hd)")
    if v_rel is not None and (v_rel.dim() != 3 or v_rel.shape[0] != hkv or v_rel.shape[1] % 2 == 0):
        raise ValueError(f"v_rel {tuple(v_rel.shape)} must be (Hkv, 2K+1, hd) with Hkv={hkv}")
    if v_pair is not None and (
        v_pair.dim() not in (4, 5)
        or v_pair.shape[-4:-1] != (hkv, n, m)
        or (v_pair.dim() == 5 and v_pair.shape[0] != b)
    ):
        raise ValueError(
            f"v_pair {tuple(v_pair.shape)} must be (Hkv, N, M, hd) = ({hkv}, {n}, {m}, hd) or "
            f"(B, Hkv, N, M, hd) with B={b}"
        )


def check_inputs(
    q, k, qr, kr, v=None, v_rel=None, attn_mask=None, is_causal=False, scale=None,
    rel_scale=None, rel_activation="identity", dropout_p=0.0, v_pair=None,
) -> dict:  # fmt: skip
    """The call's keyword arguments, validated, with the mask viewed as 4-D (v_pair only when
    given)."""
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
    check_symbol_values(v, v_rel, v_pair, b, hkv, n, m)
    if rel_activation not in REL_ACTIVATIONS:
        raise ValueError(f"rel_activation={rel_activation!r}: valid are {sorted(REL_ACTIVATIONS)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p}: must be in [0, 1)")
    mask, is_causal = check_mask(attn_mask, q, k), normal_causality(is_causal, n, m)
    checked = dict(
        q=q, k=k, qr=qr, kr=kr, v=v, v_rel=v_rel, attn_mask=mask, is_causal=is_causal,
        scale=scale, rel_scale=rel_scale, rel_activation=rel_activation, dropout_p=dropout_p,
    )  # fmt: skip
    if v_pair is not None:
        checked["v_pair"] = v_pair
    return checked


def describe_call(
    q, k, qr, kr, v=None, v_rel=None, attn_mask=None, is_causal=False, scale=None,
    rel_scale=None, rel_activation="identity", dropout_p=0.0, v_pair=None,
) -> Call:  # fmt: skip
    """The `Call` a relational attention call makes (for backend choice)."""
    tensors = [t for t in (q, k, qr, kr, v, v_rel, v_pair, attn_mask) if t is not None]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    needs = {
        "grad": grad,
        "mask": attn_mask is not None or is_causal == "bottom_right",  # a mask once lowered
        "float_mask": is_additive(attn_mask),
        "saturated_mask": grad and saturated(attn_mask),
        "causal": is_causal is True,
        "dropout": dropout_p > 0,
        "gqa": k.shape[1] != q.shape[1],
        "rel_activation": rel_activation != "identity",
        "relative_symbols": v_rel is not None,
        "no_keys": k.shape[2] == 0,
        "no_queries": q.shape[2] == 0,
        "pair_symbols": v_pair is not None,
    }
    return Call(q.device.type, q.dtype, frozenset(f for f, used in needs.items() if used))


RELATIONAL = define_family("relational", check_inputs, describe_call, lower_bottom_right)
