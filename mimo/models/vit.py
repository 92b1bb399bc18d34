"""A CLIP-style vision transformer: patch conv, class token, learned positions, pre-LN blocks.

Module names follow Hugging Face's CLIP vision tower so weights map one to one. ViTConfig options
(class_token, pre_norm, patch_bias, post_norm, layer_scale, patch_linear) turn it into a SigLIP, SigLIP2 or
DINOv2 tower.
"""

from __future__ import annotations

import torch
from torch import nn

from mimo.config.schema import ViTConfig
from mimo.models import init
from mimo.models.layers import MLP, SelfAttention


def patchify(pixel_values: torch.Tensor, patch: int) -> torch.Tensor:
    """`[B, C, H, W]` -> `[B, (H / patch) * (W / patch), patch * patch * C]`: patches in row-major order, each
    flattened (row, column, channel) as SigLIP2's processor flattens them."""
    b, c, h, w = pixel_values.shape
    x = pixel_values.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


class ViTBlock(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.self_attn = SelfAttention(cfg.hidden, cfg.heads, cfg.heads, qkv_bias=True, out_bias=True)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp = MLP(cfg.hidden, cfg.mlp, cfg.hidden, cfg.act)
        # DINOv2's layer scale: each branch's output times a learned per-channel vector.
        self.layer_scale1 = nn.Parameter(torch.ones(cfg.hidden)) if cfg.layer_scale else None
        self.layer_scale2 = nn.Parameter(torch.ones(cfg.hidden)) if cfg.layer_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.self_attn(self.layer_norm1(x), causal=False)
        x = x + (h if self.layer_scale1 is None else h * self.layer_scale1)
        h = self.mlp(self.layer_norm2(x))
        return x + (h if self.layer_scale2 is None else h * self.layer_scale2)


class VisionTransformer(nn.Module):
    """Images `[B, C, H, W]` -> patch features `[B, N, hidden]` (class token dropped if configured)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.patch_linear:
            self.patch_embedding = nn.Linear(cfg.patch * cfg.patch * cfg.channels, cfg.hidden, bias=cfg.patch_bias)
        else:
            self.patch_embedding = nn.Conv2d(cfg.channels, cfg.hidden, cfg.patch, stride=cfg.patch,
                                             bias=cfg.patch_bias)
        self.class_embedding = nn.Parameter(torch.zeros(cfg.hidden)) if cfg.class_token else None
        self.position_embedding = nn.Embedding(cfg.positions, cfg.hidden)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()
        self.layers = nn.ModuleDict({str(i): ViTBlock(cfg) for i in range(cfg.layers)})
        # SigLIP's final LayerNorm over every output token (CLIP applies its own only to the pooled token).
        self.post_layernorm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps) if cfg.post_norm else None
        self.init_weights()

    @property
    def tokens_per_image(self) -> int:
        return self.cfg.tokens_per_image

    def init_weights(self) -> None:
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, nn.Conv2d)):
                init.normal_(m.weight, std=std)
                if getattr(m, "bias", None) is not None:
                    init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                init.ones_(m.weight)
                init.zeros_(m.bias)
        if self.class_embedding is not None:
            init.normal_(self.class_embedding, std=std)
        for block in self.layers.values():
            for scale in (block.layer_scale1, block.layer_scale2):
                if scale is not None:
                    init.ones_(scale)

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.dim() != 4:
            raise ValueError(f"pixel_values must be [B, C, H, W], got shape {tuple(pixel_values.shape)}")
        pixels = pixel_values.to(self.patch_embedding.weight.dtype)
        if self.cfg.patch_linear:
            x = self.patch_embedding(patchify(pixels, self.cfg.patch))
        else:
            x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)
        if self.class_embedding is not None:
            cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
            x = torch.cat([cls, x], dim=1)
        x = x + self.position_embedding.weight.to(x.dtype)
        return self.pre_layrnorm(x)

    def run_layers(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The last layer's output -> patch features: final norm, the first token (class token, or first
        patch with `drop_first_patch`) dropped if configured."""
        if self.post_layernorm is not None:
            x = self.post_layernorm(x)
        return x[:, 1:] if self.cfg.drops_first_token else x

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """embed -> run_layers -> finish; a pipeline stage of a split ViT runs its share of the three."""
        return self.finish(self.run_layers(self.embed(pixel_values)))
