"""The Out path's image side: an output projection and a patch decoder that turn the LM's hidden states
at generation tokens into an image, and the decoder's per-patch loss.

A generated image is `P = (image / patch)^2` generation tokens in a row, one per patch, in raster order.
Their hidden states are projected to the decoder width (the output projection), given a learned
per-patch position (the LM's states at identical generation tokens need not know which patch they
are), mixed by a few bidirectional transformer blocks (so neighbouring patches agree), and mapped to
each patch's pixels in [-1, 1]. The loss is the squared error per patch (mean over its values),
returned as a sum over patches plus a patch count, like the text loss (SPEC 3.1).
"""

from __future__ import annotations

import torch
from torch import nn

from mimo.config.schema import DecoderConfig, ProjectorConfig, ViTConfig
from mimo.models import init
from mimo.models.projector import MLPProjector
from mimo.models.vit import ViTBlock


def image_to_patches(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """`[n, C, H, W]` -> `[n, P, C*patch*patch]`, patches in raster order."""
    n, c, h, w = pixels.shape
    x = pixels.reshape(n, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n, (h // patch) * (w // patch), c * patch * patch)


def patches_to_image(rows: torch.Tensor, image: int, patch: int, channels: int) -> torch.Tensor:
    """Inverse of `image_to_patches` for flat rows `[n*P, C*patch*patch]` -> `[n, C, image, image]`."""
    g = image // patch
    x = rows.reshape(-1, g, g, channels, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(-1, channels, image, image)


class PatchImageDecoder(nn.Module):
    """Rows `[n*P, hidden]` (n images of P patches) -> per-patch pixels `[n*P, C*patch*patch]`."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.patches_per_image = (cfg.image // cfg.patch) ** 2
        self.patch_dim = cfg.channels * cfg.patch**2
        block_cfg = ViTConfig(hidden=cfg.hidden, heads=cfg.heads, mlp=cfg.mlp, act=cfg.act)
        self.position_embedding = nn.Embedding(self.patches_per_image, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): ViTBlock(block_cfg) for i in range(cfg.layers)})
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, self.patch_dim)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                init.normal_(m.weight, std=cfg.init_std)
                if getattr(m, "bias", None) is not None:
                    init.zeros_(m.bias)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        p = self.patches_per_image
        if rows.dim() != 2 or rows.shape[0] % p:
            raise ValueError(f"the image decoder got rows of shape {tuple(rows.shape)}; it needs [n*{p}, hidden]: "
                             f"every generated image takes exactly {p} generation tokens ((decoder.image / "
                             f"decoder.patch)^2)")
        if rows.shape[0] == 0:
            # No image here: decode one stand-in and keep none of it, so the decoder still runs (same
            # collectives on every data-parallel rank) and its gradient is exactly zero. Adding the empty
            # rows' sum (exactly 0) keeps the stand-in connected to the input, so backward still reaches
            # it (FSDP's post-backward hooks fire there).
            return self.forward(rows.new_zeros(p, rows.shape[1]) + rows.sum())[:0]
        x = rows.reshape(-1, p, rows.shape[1]) + self.position_embedding.weight.to(rows.dtype)
        for layer in self.layers.values():
            x = layer(x)
        return self.head(self.norm(x)).reshape(-1, self.patch_dim)

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum over patches of each patch's mean squared error, number of patches)."""
        if pred.shape != target.shape:
            raise ValueError(f"decoder output {tuple(pred.shape)} and modality_targets rows {tuple(target.shape)} "
                             f"differ; targets must be [B, K, {self.patch_dim}] patches (image_to_patches)")
        dtype = torch.promote_types(pred.dtype, torch.float32)
        per_patch = (pred.to(dtype) - target.to(dtype)).pow(2).mean(-1)
        return per_patch.sum(), torch.tensor(float(per_patch.shape[0]), device=pred.device)

    def to_image(self, pred: torch.Tensor) -> torch.Tensor:
        """Decoder output rows -> images `[n, C, H, W]` clamped to [-1, 1]."""
        c = self.cfg
        return patches_to_image(pred, c.image, c.patch, c.channels).clamp(-1.0, 1.0)


def build_image_output(cfg: DecoderConfig, lm_hidden: int, init_std: float) -> tuple[list[nn.Module],
                                                                                        dict[str, nn.Module]]:
    """The output projection (LM width -> decoder width MLP) and the patch decoder of one modality."""
    proj = MLPProjector(lm_hidden, cfg.hidden, ProjectorConfig(act=cfg.act), init_std)
    return [proj], {"patch": PatchImageDecoder(cfg)}
