"""A ViT-style image classifier on the generic block, with any attention mechanism.

    patches: (B, C, H, W) -> (B, (H/ph)(W/pw), ph pw C) -> LayerNorm -> Linear -> LayerNorm
    h = [cls; patches] + pos_embedding;  h = block_l(h, symbols_l(h));  pool (cls or mean)
    logits = final_out([norm] pooled)

The patch embedding, cls token and positional embedding follow the `dual-attention`
reference's vision models (mean pooling includes the cls token there, and here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops.layers.torch import Rearrange
from torch import nn

from attn_zoo.mechanisms.base import check_int
from attn_zoo.models.block import BlockConfig
from attn_zoo.models.common import make_blocks, run_blocks, symbol_retrievers
from attn_zoo.models.norms import create_norm


def check_patches(image_shape: object, patch_size: object) -> tuple[int, int]:
    """The patch (height, width): ValueError naming the argument and its value unless
    image_shape is (channels, height, width) and patch_size one int or (height, width), each
    an integer >= 1 (a bool is none), the patches tiling the image."""
    if not isinstance(image_shape, tuple | list) or len(image_shape) != 3:
        raise ValueError(f"image_shape={image_shape!r}: must be (channels, height, width)")
    for i, size in enumerate(image_shape):
        check_int(f"image_shape[{i}]", size)
    if not isinstance(patch_size, tuple | list):
        check_int("patch_size", patch_size)
        patch_size = (patch_size, patch_size)
    if len(patch_size) != 2:
        raise ValueError(f"patch_size={patch_size!r}: must be one int or (height, width)")
    for i, size in enumerate(patch_size):
        check_int(f"patch_size[{i}]", size)
    (_, height, width), (ph, pw) = image_shape, patch_size
    if height % ph or width % pw:
        raise ValueError(f"image {height}x{width} is not divisible into {ph}x{pw} patches")
    return ph, pw


class VisionClassifier(nn.Module):
    def __init__(
        self,
        image_shape: tuple[int, int, int],
        patch_size: int | tuple[int, int],
        num_classes: int,
        d_model: int | None = None,
        n_layers: int = 1,
        pool: str = "cls",
        final_norm: bool = True,
        config: BlockConfig | None = None,
        **block_settings,
    ):
        """image_shape (channels, height, width); patch_size (height, width) or one int; all
        integers >= 1 (`check_patches`); block_settings: `BlockConfig` fields (activation
        defaults to gelu here), or a whole `config`; the blocks are never causal."""
        ph, pw = check_patches(image_shape, patch_size)
        super().__init__()
        if d_model is not None:
            block_settings["d_model"] = d_model
        if config is None:
            block_settings.setdefault("activation", "gelu")
        c = BlockConfig.resolve(config, **block_settings, causal=False)
        self.config = c
        d_model = c.d_model
        channels, height, width = image_shape
        if pool not in ("cls", "mean"):
            raise ValueError(f"pool={pool!r}: valid are 'cls', 'mean'")
        self.image_shape, self.pool = tuple(image_shape), pool
        n_patches, patch_dim = (height // ph) * (width // pw), ph * pw * channels
        self.patch_embedding = nn.Sequential(
            Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=ph, p2=pw),
            nn.LayerNorm(patch_dim),
            nn.Linear(patch_dim, d_model),
            nn.LayerNorm(d_model),
        )
        self.pos_embedding = nn.Parameter(torch.randn(1, n_patches + 1, d_model))
        self.cls_token = nn.Parameter(torch.randn(1, 1, d_model))
        self.dropout = nn.Dropout(c.dropout)
        self.symbol_retriever = symbol_retrievers(c, n_layers)
        self.blocks = make_blocks(n_layers, c)
        self.norm = create_norm(d_model, c.norm_type if final_norm else "none")
        self.final_out = nn.Linear(d_model, num_classes)

    def forward(
        self, images: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """images (B, C, H, W) -> logits (B, num_classes) and the mean cross-entropy loss."""
        if images.dim() != 4 or tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(
                f"images must be (B, C, H, W) = (B, {', '.join(map(str, self.image_shape))}), "
                f"got {tuple(images.shape)}"
            )
        patches = self.patch_embedding(images)
        h = torch.cat([self.cls_token.expand(images.shape[0], -1, -1), patches], dim=1)
        h = self.dropout(h + self.pos_embedding)
        h = run_blocks(self.blocks, self.symbol_retriever, h)
        pooled = h[:, 0] if self.pool == "cls" else h.mean(dim=1)
        logits = self.final_out(self.norm(pooled))
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss
