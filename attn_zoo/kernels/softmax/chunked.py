"""Softmax attention in (query block x key block) tiles with an online softmax.

Forward keeps, per query row, a running max m, a running sum l and an accumulator:

    m' = max(m, max_j s_ij),  l' = l e^(m - m') + sum_j e^(s_ij - m'),
    acc' = acc e^(m - m') + sum_j e^(s_ij - m') v_j,     out = acc / l

and saves only q, k, v, out and the row statistics (m, log l). Backward recomputes each tile's
probabilities from them, p_ij = e^((s_ij - m_i) - log l_i) (not from lse = m + log l: where an
additive mask holds float32's min, m is about -3.4e38 and log l vanishes in the sum), and uses
D_i = <dout_i, out_i>:

    dv_j += sum_i p_ij dout_i,   ds_ij = p_ij (<dout_i, v_j> - D_i),
    dq_i += scale sum_j ds_ij k_j,   dk_j += scale sum_i ds_ij q_i

so training memory is O(N x block), never O(N x M). An additive float mask that requires grad
gets dmask_ij = ds_ij, summed over the dims it broadcasts (its gradient has its own shape).
Causality, top-left (j <= i) or bottom-right (j <= i + M - N), is applied per tile: tiles
wholly above the diagonal are skipped, the diagonal's tiles build their own (bq, bk) mask, so
neither alignment costs an N x M mask. Score and mask mods (mods.py) are evaluated per tile
too, so each is first checked pointwise (mods.check_pointwise, in the softmax family's input
check that every call passes: a mod whose tiles disagree with its whole, a top-k over keys or
queries or one reading the index tensors' shapes, or that is impure without declaring it, is
refused, not served). A mask mod's block mask (blocks.py: derived from the mod once per mod
and shape, cached) says which tiles it leaves empty, full or partial: empty tiles are never
touched, full ones apply no mask mod, so a local mask or a combination of them (a sliding
window of w keys, documents, a prefix LM, with causality or not) costs O(N visible) time and
memory. Backward takes the score mod's derivative tile by tile (autograd on the recomputed
tile: ds_raw = ds d score_mod / d s). Both passes run outside autocast, in the inputs' dtype
(under it, a bfloat16 forward and a float32 backward gave gradients of other weights than
the forward's: rows summing to 1 +- 2e-3). As backward calls the mods again, chunked refuses a mod
declaring pure = False where there is a backward, and a score mod capturing a tensor that
requires grad (``impure_mod``, ``mod_grad``: naive serves them), and checks that each row's
recomputed weights still sum to 1 (eager calls), so an undeclared impure mod that the check's
probe did not catch is an error too.
Dropout masks are drawn per tile from a seed and redrawn in backward. Half-precision inputs
are computed in float32.
"""

import torch
from einops import einsum, rearrange

from attn_zoo.kernels.dispatch import Capabilities, register_backend
from attn_zoo.kernels.heads import group_queries
from attn_zoo.kernels.softmax.blocks import EMPTY, FULL, block_mask
from attn_zoo.kernels.softmax.family import (
    BOTTOM_RIGHT,
    FEATURES,
    MODS,
    RECOMPUTES_MODS,
)
from attn_zoo.kernels.softmax.masks import causal_mask, is_additive, restrict
from attn_zoo.kernels.softmax.mods import (
    MaskMod,
    ScoreMod,
    apply_mask_mod,
    mod_indices,
    modded_scores,
)
from attn_zoo.kernels.softmax.naive import upcast_half

BLOCK = 256  # fastest of 128, 256, 512 on the 2-core CPU (N=2048, fwd+bwd)
RECOMPUTED_DRIFT = 1e-3  # a row's backward weights summing further from 1: a mod changed


class Tiles:
    """The tiling of one call: block ranges, the tile mask and the per-tile dropout.

    q (B, Hkv, G, N, d) grouped, k (B, Hkv, M, d), attn_mask None or 4-D broadcastable to
    (B, H, N, M) (`add_mask_grad` gives its gradient in its own shape); is_causal False, True
    (top-left: key j allowed iff j <= i) or "bottom_right" (j <= i + M - N); `classes`: the
    mask mod's block mask (blocks.py) as lists, classes[I][J] of query tile I and key tile J,
    or None without a mask mod.
    """

    def __init__(self, q, k, attn_mask, is_causal, dropout_p, seed, block, mods=(None, None)):
        self.score_mod, self.mask_mod = mods
        self.shape = q.shape  # (B, Hkv, G, N, d)
        self.n, self.m = q.shape[3], k.shape[2]
        self.mask_shape = None if attn_mask is None else attn_mask.shape
        if attn_mask is not None:  # broadcast dims made explicit (a free view) so tiles slice
            heads = q.shape[1] * q.shape[2]
            attn_mask = attn_mask.expand(attn_mask.shape[0], heads, self.n, self.m)
        self.attn_mask, self.is_causal = attn_mask, bool(is_causal)
        self.offset = self.m - self.n if is_causal == "bottom_right" else 0  # j <= i + offset
        self.dropout_p, self.seed, self.block = dropout_p, seed, block
        self.n_key_blocks = -(-self.m // block)
        self.classes = None
        if self.mask_mod is not None:
            b, heads = q.shape[0], q.shape[1] * q.shape[2]
            classes = block_mask(self.mask_mod, b, heads, self.n, self.m, block, q.device)
            self.classes = classes.tolist()

    def query_blocks(self):
        return [(i, min(i + self.block, self.n)) for i in range(0, self.n, self.block)]

    def key_blocks(self, i0: int, i1: int):
        """Key ranges for queries [i0, i1): those not wholly above the diagonal (none when
        every query precedes the first key, bottom-right with N > M) nor empty in the mask
        mod's block mask."""
        stop = min(self.m, i1 + self.offset) if self.is_causal else self.m
        keys = [(j, min(j + self.block, self.m)) for j in range(0, stop, self.block)]
        if self.classes is None:
            return keys
        row = self.classes[i0 // self.block]
        return [(j0, j1) for j0, j1 in keys if row[j0 // self.block] != EMPTY]

    def tile_mask(self, i0, i1, j0, j1, device):
        """The tile's mask (boolean or additive), broadcastable to (B, Hkv, G, bq, bk), or None
        when all is allowed."""
        mask = None
        if self.attn_mask is not None:
            tile = self.attn_mask[..., i0:i1, j0:j1]
            mask = rearrange(tile, "b (h g) n m -> b h g n m", h=self.shape[1])
        if self.is_causal and j1 - 1 > i0 + self.offset:  # last key past the first row's limit
            offset = i0 + self.offset - j0
            mask = restrict(mask, causal_mask(i1 - i0, j1 - j0, device, offset=offset))
        if self.mask_mod is not None and self.classes[i0 // self.block][j0 // self.block] != FULL:
            allowed = apply_mask_mod(self.mask_mod, self.indices(i0, i1, j0, j1, device))
            if allowed.shape[1] == 1:  # the same for every head
                mask = restrict(mask, allowed.unsqueeze(2))
            else:
                grouped = rearrange(allowed, "b (h g) n m -> b h g n m", h=self.shape[1])
                mask = restrict(mask, grouped)
        return mask

    def indices(self, i0, i1, j0, j1, device) -> tuple[torch.Tensor, ...]:
        """The mods' index tensors of a tile: (b, h, q_idx, kv_idx), h over every query head."""
        heads = self.shape[1] * self.shape[2]
        return mod_indices(self.shape[0], heads, (i0, i1), (j0, j1), device)

    def modded(self, raw, i0, i1, j0, j1):
        """A tile's raw scores (B, Hkv, G, bq, bk) through the score mod."""
        if self.score_mod is None:
            return raw
        flat = rearrange(raw, "b h g n m -> b (h g) n m")
        flat = modded_scores(self.score_mod, flat, self.indices(i0, i1, j0, j1, raw.device))
        return rearrange(flat, "b (h g) n m -> b h g n m", h=self.shape[1])

    def keep(self, i0, i1, j0, j1, like):
        """Dropout multiplier of a tile (0 or 1/(1-p)), the same in forward and backward."""
        index = (i0 // self.block) * self.n_key_blocks + j0 // self.block
        gen = torch.Generator(device=like.device).manual_seed(self.seed + index)
        shape = (*self.shape[:3], i1 - i0, j1 - j0)
        draw = torch.rand(shape, generator=gen, device=like.device, dtype=like.dtype)
        return (draw >= self.dropout_p).to(like.dtype) / (1 - self.dropout_p)

    def online_softmax(self, q, k, scale, width, values):
        """Forward over all tiles: (out (B, Hkv, G, N, width), stats (B, Hkv, G, N, 2)), stats
        each row's max m and log l (`probabilities` reads them).

        values(p, i0, i1, j0, j1) -> (B, Hkv, G, i1-i0, width) is sum_j p_ij V_ij of a tile,
        for the tile's (dropped-out, unnormalised) weights p. Rows with no key: out 0, m +inf
        and log l 0 (so that their p is 0 in backward).
        """
        out = q.new_zeros(*q.shape[:-1], width)
        stats = q.new_zeros(*q.shape[:-1], 2)
        for i0, i1 in self.query_blocks():
            qi = q[..., i0:i1, :]
            m = q.new_full(qi.shape[:-1], float("-inf"))
            total = q.new_zeros(qi.shape[:-1])
            acc = q.new_zeros(*qi.shape[:-1], width)
            for j0, j1 in self.key_blocks(i0, i1):
                s = self.scores(qi, k[:, :, j0:j1], scale, i0, i1, j0, j1)
                m_new = torch.maximum(m, s.amax(dim=-1))
                m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)
                p = torch.exp(s - m_safe[..., None])
                rescale = torch.exp(m - m_safe)
                total = total * rescale + p.sum(dim=-1)
                if self.dropout_p > 0:
                    p = p * self.keep(i0, i1, j0, j1, p)
                acc = acc * rescale[..., None] + values(p, i0, i1, j0, j1)
                m = m_new
            seen = total > 0
            out[..., i0:i1, :] = acc / torch.where(seen, total, 1.0)[..., None]
            stats[..., i0:i1, 0] = torch.where(seen, m, float("inf"))
            stats[..., i0:i1, 1] = torch.where(seen, torch.log(total), 0.0)
        return out, stats

    @staticmethod
    def probabilities(s: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        """A tile's weights p_ij = e^((s_ij - m_i) - log l_i) from its scores s (..., bq, bk)
        and its rows' `stats` (..., bq, 2) (`online_softmax`): 0 for a row that saw no key."""
        return torch.exp((s - stats[..., 0, None]) - stats[..., 1, None])

    def add_mask_grad(self, dmask, ds, i0, i1, j0, j1) -> None:
        """Add a tile's score gradient ds (B, Hkv, G, bq, bk) into `dmask` (the mask's shape):
        the mask is added to the scores, so dmask = ds summed over the dims it broadcasts."""
        ds = rearrange(ds, "b h g n m -> b (h g) n m")
        dims = [d for d in range(4) if dmask.shape[d] == 1 and ds.shape[d] != 1]
        if dims:
            ds = ds.sum(dim=dims, keepdim=True)
        rows = slice(i0, i1) if dmask.shape[2] != 1 else slice(0, 1)
        cols = slice(j0, j1) if dmask.shape[3] != 1 else slice(0, 1)
        dmask[:, :, rows, cols] += ds

    def scores(self, qi, kj, scale, i0, i1, j0, j1, raw=None):
        """A tile's scores, modded and masked; `raw`: the tile's q k^T scale if computed."""
        if raw is None:
            raw = einsum(qi, kj, "b h g n d, b h m d -> b h g n m") * scale
        s = self.modded(raw, i0, i1, j0, j1)
        mask = self.tile_mask(i0, i1, j0, j1, s.device)
        if mask is None:
            return s
        return s + mask if is_additive(mask) else s.masked_fill(~mask, float("-inf"))


class ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, attn_mask, is_causal, scale, dropout_p, seed, block, mods):
        tiles = Tiles(q, k, attn_mask, is_causal, dropout_p, seed, block, mods)

        def values(p, i0, i1, j0, j1):
            return einsum(p, v[:, :, j0:j1], "b h g n m, b h m d -> b h g n d")

        with torch.autocast(q.device.type, enabled=False):  # in the inputs' dtype, as backward
            out, stats = tiles.online_softmax(q, k, scale, v.shape[-1], values)
        ctx.save_for_backward(q, k, v, out, stats)
        ctx.tiles, ctx.scale = tiles, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        with torch.autocast(dout.device.type, enabled=False):  # the forward's scores again
            return ChunkedAttention.gradients(ctx, dout)

    @staticmethod
    def gradients(ctx, dout):
        """dq, dk, dv and the mask's gradient, from the tiles recomputed (module docstring)."""
        q, k, v, out, stats = ctx.saved_tensors
        tiles, scale = ctx.tiles, ctx.scale
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dmask = q.new_zeros(tiles.mask_shape) if ctx.needs_input_grad[3] else None
        delta = (dout * out).sum(dim=-1)  # D_i
        # a mod's scores recomputed: check that they are the forward's (eager only: a
        # data-dependent branch would break a compiled graph)
        recheck = tiles.score_mod is not None or tiles.mask_mod is not None
        recheck = recheck and not torch.compiler.is_compiling()
        drift = q.new_zeros(())  # the largest |sum_j p_ij - 1| of a row that saw a key
        for i0, i1 in tiles.query_blocks():
            qi, doi = q[..., i0:i1, :], dout[..., i0:i1, :]
            total = q.new_zeros(qi.shape[:-1])
            for j0, j1 in tiles.key_blocks(i0, i1):
                kj, vj = k[:, :, j0:j1], v[:, :, j0:j1]
                raw = einsum(qi, kj, "b h g n d, b h m d -> b h g n m") * scale
                modded = tiles.score_mod is not None
                if modded:  # its derivative, by autograd on the tile
                    raw = raw.detach().requires_grad_(True)
                with torch.enable_grad():  # a copy of the leaf: a mod may add to it in place
                    given = raw.clone() if modded else raw
                    s_graph = tiles.scores(qi, kj, scale, i0, i1, j0, j1, given)
                s = s_graph.detach()
                p = tiles.probabilities(s, stats[..., i0:i1, :])
                if recheck:
                    total += p.sum(dim=-1)
                dp = einsum(doi, vj, "b h g n d, b h m d -> b h g n m")
                p_used = p
                if tiles.dropout_p > 0:
                    keep = tiles.keep(i0, i1, j0, j1, p)
                    p_used, dp = p * keep, dp * keep
                dv[:, :, j0:j1] += einsum(p_used, doi, "b h g n m, b h g n d -> b h m d")
                ds = p * (dp - delta[..., i0:i1, None])
                ds_raw = ds
                if modded:
                    (ds_raw,) = torch.autograd.grad(s_graph, raw, ds.masked_fill(p == 0, 0.0))
                dq[..., i0:i1, :] += einsum(ds_raw, kj, "b h g n m, b h m d -> b h g n d") * scale
                dk[:, :, j0:j1] += einsum(ds_raw, qi, "b h g n m, b h g n d -> b h m d") * scale
                if dmask is not None:
                    tiles.add_mask_grad(dmask, ds, i0, i1, j0, j1)
            if recheck and total.numel():
                off = (total - 1).abs().masked_fill(stats[..., i0:i1, 0] == float("inf"), 0.0)
                drift = torch.maximum(drift, off.max())
        if recheck and drift > RECOMPUTED_DRIFT:
            raise RuntimeError(
                "chunked softmax: a score or mask mod gave other scores when called again in "
                f"backward (a row's recomputed weights sum to 1 +- {drift.item():.3g}, not 1); "
                "chunked recomputes the mods, so a mod whose result changes between calls "
                "(random, stateful) must declare it (mod.pure = False): naive then serves it"
            )
        if dmask is not None:
            dmask = dmask.to(tiles.attn_mask.dtype)
        return dq, dk, dv, dmask, None, None, None, None, None, None


@register_backend(
    "softmax",
    "chunked",
    tier="chunked",
    priority=10,
    capabilities=Capabilities(
        (FEATURES - RECOMPUTES_MODS) | BOTTOM_RIGHT | MODS,
        why={
            "impure_mod": "it calls the mods again in backward; a mod declaring pure = False "
            "would give other scores there",
            "mod_grad": "it calls the score mod again in backward and gives gradients to q "
            "and k only, none to the tensors the mod captures",
        },
    ),
    block_sizes=(BLOCK,),
)
def chunked(
    q: torch.Tensor,  # (B, H, N, dk)
    k: torch.Tensor,  # (B, Hkv, M, dk)
    v: torch.Tensor,  # (B, Hkv, M, dv)
    attn_mask: torch.Tensor | None = None,
    is_causal: bool | str = False,  # False, True (top-left) or "bottom_right"
    scale: float | None = None,
    dropout_p: float = 0.0,
    score_mod: ScoreMod | None = None,
    mask_mod: MaskMod | None = None,
    block: int = BLOCK,
) -> torch.Tensor:  # (B, H, N, dv)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    seed = int(torch.randint(2**62, (1,))) if dropout_p > 0 else 0
    # contiguous once: tiles of strided views would be copied again in every einsum
    grouped = group_queries(upcast_half(q), k.shape[1]).contiguous()
    k, v = upcast_half(k).contiguous(), upcast_half(v).contiguous()
    mods = (score_mod, mask_mod)
    out = ChunkedAttention.apply(
        grouped, k, v, attn_mask, is_causal, scale, dropout_p, seed, block, mods
    )
    return rearrange(out, "b h g n d -> b (h g) n d").to(q.dtype)
