"""Sigmoid attention in (query block x key block) tiles: O(N) memory, forward and backward.

Sigmoid attention has no normaliser, so the tiles of keys simply add up (no online rescaling
as in softmax's chunked kernel):

    out_i = sum_tiles sum_{j in tile} p_ij v_j,    p_ij = sigmoid(s_ij),  s_ij = scale q_i.k_j + b

Forward saves only q, k, v; backward recomputes each tile's p and uses sigmoid' = p (1 - p):

    dv_j += sum_i p_ij dout_i,   ds_ij = <dout_i, v_j> p_ij (1 - p_ij),
    dq_i += scale sum_j ds_ij k_j,   dk_j += scale sum_i ds_ij q_i

so training memory is O(N x block), never O(N x M). An additive float mask that requires grad
gets dmask_ij = ds_ij, summed over the dims it broadcasts. Masks and causality (top-left or
bottom-right, tiles wholly above the diagonal skipped) come from softmax's `Tiles`: a masked
score is -inf, whose sigmoid is 0. Half-precision inputs are computed in float32.
"""

import torch
from einops import einsum, rearrange

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import group_queries
from attn_zoo.kernels.sigmoid.family import FEATURES
from attn_zoo.kernels.softmax.chunked import Tiles
from attn_zoo.kernels.softmax.family import BOTTOM_RIGHT
from attn_zoo.kernels.softmax.naive import upcast_half

BLOCK = 128  # N = 2048 causal, fwd + bwd, loaded 2-core CPU: 64 4.1 s, 128 1.4 s, 256 1.2 s


class ChunkedSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, attn_mask, is_causal, scale, bias, block):
        tiles = Tiles(q, k, attn_mask, is_causal, 0.0, 0, block)
        out = q.new_zeros(*q.shape[:-1], v.shape[-1])
        for i0, i1 in tiles.query_blocks():
            qi = q[..., i0:i1, :]
            for j0, j1 in tiles.key_blocks(i0, i1):
                p = torch.sigmoid(tiles.scores(qi, k[:, :, j0:j1], scale, i0, i1, j0, j1) + bias)
                out[..., i0:i1, :] += einsum(p, v[:, :, j0:j1], "b h g n m, b h m d -> b h g n d")
        ctx.save_for_backward(q, k, v)
        ctx.tiles, ctx.scale, ctx.bias = tiles, scale, bias
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        tiles, scale, bias = ctx.tiles, ctx.scale, ctx.bias
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dmask = q.new_zeros(tiles.mask_shape) if ctx.needs_input_grad[3] else None
        for i0, i1 in tiles.query_blocks():
            qi, doi = q[..., i0:i1, :], dout[..., i0:i1, :]
            for j0, j1 in tiles.key_blocks(i0, i1):
                kj, vj = k[:, :, j0:j1], v[:, :, j0:j1]
                p = torch.sigmoid(tiles.scores(qi, kj, scale, i0, i1, j0, j1) + bias)
                dv[:, :, j0:j1] += einsum(p, doi, "b h g n m, b h g n d -> b h m d")
                dp = einsum(doi, vj, "b h g n d, b h m d -> b h g n m")
                ds = dp * p * (1 - p)
                dq[..., i0:i1, :] += einsum(ds, kj, "b h g n m, b h m d -> b h g n d") * scale
                dk[:, :, j0:j1] += einsum(ds, qi, "b h g n m, b h g n d -> b h m d") * scale
                if dmask is not None:
                    tiles.add_mask_grad(dmask, ds, i0, i1, j0, j1)
        if dmask is not None:
            dmask = dmask.to(tiles.attn_mask.dtype)
        return dq, dk, dv, dmask, None, None, None, None


@register_backend(
    "sigmoid",
    "chunked",
    tier="chunked",
    priority=10,
    capabilities=Capabilities(FEATURES | BOTTOM_RIGHT),
    block_sizes=(BLOCK,),
)
def chunked(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool | str = False,  # False, True (top-left) or "bottom_right"
    scale: float | None = None,
    bias: float = 0.0,
    block: int = BLOCK,
) -> torch.Tensor:  # (B, H, N, dv)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    grouped = group_queries(upcast_half(q), k.shape[1]).contiguous()
    k, v = upcast_half(k).contiguous(), upcast_half(v).contiguous()
    out = ChunkedSigmoid.apply(grouped, k, v, attn_mask, is_causal, scale, bias, block)
    return rearrange(out, "b h g n d -> b (h g) n d").to(q.dtype)
