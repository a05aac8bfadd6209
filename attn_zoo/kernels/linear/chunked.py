"""Linear attention, chunkwise recurrent: O(N) time and memory (Katharopoulos et al. 2020).

Non-causal, the sums over keys are shared by every query:

    S = sum_j phi(k_j) v_j^T (dk, dv),   z = sum_j phi(k_j) (dk),   out_i = phi(q_i) S / phi(q_i) z

Causal, queries go in chunks of `chunk` positions; the state (S, z) holds the keys before the
chunk and the keys inside it are handled in the quadratic form, masked causally:

    out_i = (phi(q_i) S + sum_{j in chunk, j <= i} A_ij v_j) / (phi(q_i) z + sum_{..} A_ij)

then the chunk's keys are added to the state. Work O(N (chunk + dk) dv). A key mask that does
not depend on the query (shape (B, H, 1, M), e.g. padding) zeroes phi(k_j) of the masked
keys; masks that differ per query need the naive backend.
"""

import torch
from einops import einsum

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import repeat_kv
from attn_zoo.kernels.linear.family import FEATURES
from attn_zoo.kernels.linear.naive import elu_feature_map, normalise
from attn_zoo.kernels.softmax.masks import causal_mask
from attn_zoo.kernels.softmax.naive import upcast_half

CHUNK = 64


@register_backend(
    "linear",
    "chunked",
    tier="chunked",
    priority=10,
    capabilities=Capabilities(
        FEATURES - {"mask"},
        why={
            "mask": "the chunkwise form shares its key sums across queries, so it serves only "
            "masks that do not depend on the query (shape (B, H, 1, M), e.g. padding); use 'naive'"
        },
    ),
    block_sizes=(CHUNK,),
)
def chunked(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,  # (B|1, H|1, 1 or N, M), the same for every query
    is_causal: bool = False,
    chunk: int = CHUNK,
) -> torch.Tensor:  # (B, H, N, dv)
    dtype = q.dtype
    q, k, v = (upcast_half(t) for t in (q, k, v))
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    n, m = q.shape[2], k.shape[2]
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    if attn_mask is not None:  # (B|1, H|1, 1, M), one row for all -> zero the masked keys
        phi_k = phi_k * attn_mask[..., :1, :].transpose(-1, -2).to(phi_k.dtype)
    if not is_causal:
        state = einsum(phi_k, v, "b h m d, b h m e -> b h d e")
        numerator = einsum(phi_q, state, "b h n d, b h d e -> b h n e")
        denominator = einsum(phi_q, phi_k.sum(dim=2), "b h n d, b h d -> b h n")
        return normalise(numerator, denominator).to(dtype)

    state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])  # S: keys before the chunk
    key_sum = q.new_zeros(*q.shape[:2], q.shape[-1])  # z
    outputs = [einsum(phi_q[:, :, :0], state, "b h n d, b h d e -> b h n e")]  # (N = 0)
    for i0 in range(0, n, chunk):
        i1 = min(i0 + chunk, n)
        j0, j1 = min(i0, m), min(i1, m)  # the chunk's own keys (none once past the last key)
        pq, pk, vj = phi_q[:, :, i0:i1], phi_k[:, :, j0:j1], v[:, :, j0:j1]
        scores = einsum(pq, pk, "b h n d, b h m d -> b h n m")
        scores = scores.masked_fill(~causal_mask(i1 - i0, j1 - j0, q.device, offset=i0 - j0), 0)
        numerator = einsum(pq, state, "b h n d, b h d e -> b h n e") + einsum(
            scores, vj, "b h n m, b h m e -> b h n e"
        )
        denominator = einsum(pq, key_sum, "b h n d, b h d -> b h n") + scores.sum(dim=-1)
        outputs.append(normalise(numerator, denominator))
        state = state + einsum(pk, vj, "b h m d, b h m e -> b h d e")
        key_sum = key_sum + pk.sum(dim=2)
    return torch.cat(outputs, dim=2).to(dtype)
