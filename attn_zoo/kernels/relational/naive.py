"""Relational attention, materialised: the ground truth (Altabaa & Lafferty, arXiv 2405.16727).

Per head h and relation l, with a_ij^h the softmax attention of q_i^h on k_j^h (masked; a row
with no allowed key gives zeros):

    r_ij^l = act(rel_scale <qr_i^l, kr_j^l>)                 relations, unmasked
    sym_i^h = sum_j a_ij^h v_j^h        (relative symbols: v_ij^h = table^h[clip(j-i, -K, K)+K])
    rel_i^{h,l} = sum_j a_ij^h r_ij^l

and the kernel returns [sym | rel] on the last axis, (B, H, N, hd + R). The mechanism applies
W_r (rel -> hd per head) and the output projection. Memory O(B (H + R) N M). Half-precision
inputs are computed in float32.
"""

import torch
import torch.nn.functional as F
from einops import einsum

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.relational.activations import REL_ACTIVATIONS
from attn_zoo.kernels.relational.family import FEATURES
from attn_zoo.kernels.softmax.naive import attention_weights, upcast_half


def relative_index(n: int, m: int, max_rel_pos: int, device, offset: int = 0, key_offset: int = 0):
    """(n, m) long: clip(j - i, -K, K) + K for queries offset.. and keys key_offset.."""
    i = torch.arange(offset, offset + n, device=device)[:, None]
    j = torch.arange(key_offset, key_offset + m, device=device)[None, :]
    return (j - i).clamp(-max_rel_pos, max_rel_pos) + max_rel_pos


def default_scales(q, qr, scale: float | None, rel_scale: float | None) -> tuple[float, float]:
    """Attention scale 1/sqrt(dk) and relation scale 1/sqrt(dr) unless given."""
    return (
        q.shape[-1] ** -0.5 if scale is None else scale,
        qr.shape[-1] ** -0.5 if rel_scale is None else rel_scale,
    )


def relation_tensor(
    qr: torch.Tensor,  # (B, R, N, dr)
    kr: torch.Tensor,  # (B, R, M, dr)
    rel_scale: float | None = None,
    rel_activation: str = "identity",
) -> torch.Tensor:  # (B, R, N, M)
    """r_ij^l = act(rel_scale <qr_i^l, kr_j^l>), materialised and unmasked."""
    rel_scale = qr.shape[-1] ** -0.5 if rel_scale is None else rel_scale
    raw = einsum(upcast_half(qr), upcast_half(kr), "b r n d, b r m d -> b r n m") * rel_scale
    return REL_ACTIVATIONS[rel_activation](raw)


@register_backend(
    "relational", "naive", tier="naive", priority=0, capabilities=Capabilities(FEATURES)
)
def naive(
    q: torch.Tensor,  # (B, H, N, dk) attention queries
    k: torch.Tensor,  # (B, Hkv, M, dk) attention keys
    qr: torch.Tensor,  # (B, R, N, dr) relation queries
    kr: torch.Tensor,  # (B, R, M, dr) relation keys
    v: torch.Tensor | None = None,  # (B, Hkv, M, hd) symbol values
    v_rel: torch.Tensor | None = None,  # (Hkv, 2K+1, hd) relative symbol values, instead of v
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    rel_scale: float | None = None,
    rel_activation: str = "identity",
    dropout_p: float = 0.0,
) -> torch.Tensor:  # (B, H, N, hd + R)
    heads, n, m, dtype = q.shape[1], q.shape[2], k.shape[2], q.dtype
    v, v_rel = (None if t is None else upcast_half(t) for t in (v, v_rel))
    attn = attention_weights(q, k, attn_mask, is_causal, scale)
    if dropout_p > 0:
        attn = F.dropout(attn, dropout_p)
    relations = relation_tensor(qr, kr, rel_scale, rel_activation)
    if v_rel is None:
        sym = einsum(attn, repeat_kv(v, heads), "b h n m, b h m d -> b h n d")
    else:
        table = repeat_kv(v_rel[None], heads)[0]  # (H, 2K+1, hd)
        values = table[:, relative_index(n, m, (v_rel.shape[1] - 1) // 2, q.device)]
        sym = einsum(attn, values, "b h n m, h n m d -> b h n d")
    rel = einsum(attn, relations, "b h n m, b r n m -> b h n r")
    return torch.cat([sym, rel], dim=-1).to(dtype)
