"""Relational attention, materialised: the ground truth (Altabaa & Lafferty, arXiv 2405.16727).

Per head h and relation l, with a_ij^h the softmax attention of q_i^h on k_j^h (masked; a row
with no allowed key gives zeros, and so does every row when there are no keys):

    r_ij^l = act(rel_scale <qr_i^l, kr_j^l>)                 relations, unmasked
    sym_i^h = sum_j a_ij^h v_ij^h        v_ij^h = v_j^h (absolute), table^h[clip(j-i, -K, K)+K]
                                         (relative) or v_pair^h[i, j] (pairwise)
    rel_i^{h,l} = sum_j a_ij^h r_ij^l

and the kernel returns [sym | rel] on the last axis, (B, H, N, hd + R). The mechanism applies
W_r (rel -> hd per head) and the output projection. Memory O(B (H + R) N M). Half-precision
inputs are computed in float32.
"""

import torch
import torch.nn.functional as F
from einops import einsum, rearrange

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.relational.activations import REL_ACTIVATIONS
from attn_zoo.kernels.relational.family import FEATURES, PAIR_SYMBOLS
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


def attention_tensor(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
) -> torch.Tensor:  # (B, H, N, M), float32 or wider
    """The attention weights a_ij^h, materialised; with no keys (M = 0) the empty (B, H, N, 0)
    scores, still in the graph of q and k."""
    if k.shape[2] == 0:
        keys = repeat_kv(upcast_half(k), q.shape[1])
        return einsum(upcast_half(q), keys, "b h n d, b h m d -> b h n m")
    return attention_weights(q, k, attn_mask, is_causal, scale)


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


def aggregate(
    attn: torch.Tensor,  # (B, H, N, M) attention weights (after any dropout)
    relations: torch.Tensor,  # (B, R, N, M)
    v: torch.Tensor | None = None,  # (B, Hkv, M, hd)
    v_rel: torch.Tensor | None = None,  # (Hkv, 2K+1, hd)
    v_pair: torch.Tensor | None = None,  # (Hkv, N, M, hd) or (B, Hkv, N, M, hd)
) -> torch.Tensor:  # (B, H, N, hd + R)
    """[sum_j a_ij v_ij | sum_j a_ij r_ij] for materialised weights and relations."""
    heads, n, m = attn.shape[1:]
    if v is not None:
        sym = einsum(attn, repeat_kv(upcast_half(v), heads), "b h n m, b h m d -> b h n d")
    elif v_rel is not None:
        table = repeat_kv(upcast_half(v_rel)[None], heads)[0]  # (H, 2K+1, hd)
        values = table[:, relative_index(n, m, (v_rel.shape[1] - 1) // 2, attn.device)]
        sym = einsum(attn, values, "b h n m, h n m d -> b h n d")
    else:
        grouped = rearrange(attn, "b (h g) n m -> b h g n m", h=v_pair.shape[-4])
        pattern = "h n m d" if v_pair.dim() == 4 else "b h n m d"
        sym = einsum(grouped, upcast_half(v_pair), f"b h g n m, {pattern} -> b h g n d")
        sym = rearrange(sym, "b h g n d -> b (h g) n d")
    rel = einsum(attn, relations, "b h n m, b r n m -> b h n r")
    return torch.cat([sym, rel], dim=-1)


@register_backend(
    "relational",
    "naive",
    tier="naive",
    priority=0,
    capabilities=Capabilities(FEATURES | PAIR_SYMBOLS),
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
    v_pair: torch.Tensor | None = None,  # (B?, Hkv, N, M, hd) pairwise symbol values, instead
) -> torch.Tensor:  # (B, H, N, hd + R)
    attn = attention_tensor(q, k, attn_mask, is_causal, scale)
    if dropout_p > 0:
        attn = F.dropout(attn, dropout_p)
    relations = relation_tensor(qr, kr, rel_scale, rel_activation)
    return aggregate(attn, relations, v, v_rel, v_pair).to(q.dtype)
