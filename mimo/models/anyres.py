"""LLaVA-NeXT's "anyres" images: each image is tiled at the best of a set of resolutions (plus one overview
tile at the tower's size), every tile goes through the vision tower and the projector, and the tiles' rows are
put back in their places on the image, cropped to its aspect ratio, with a learned newline row closing each
line of patches. So an image gives a number of rows that depends on its size, as transformers'
LlavaNextForConditionalGeneration computes them ("spatial_unpad"); LLaVA-OneVision also shrinks a grid larger
than its anyres_max_N tiles' area.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mimo.models.init import normal_
from mimo.models.multimodal import ModalitySubmodules


def select_best_resolution(size: tuple[int, int], resolutions: list[list[int]]) -> tuple[int, int]:
    """The (height, width) of `resolutions` that keeps most of an image of `size` (height, width) when it is
    scaled to fit, the one that wastes least on a tie."""
    height, width = size
    best, most, least_waste = (0, 0), 0, float("inf")
    for h, w in resolutions:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = h * w - kept
        if kept > most or (kept == most and waste < least_waste):
            best, most, least_waste = (h, w), kept, waste
    return best


def unpad(features: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """`[D, H, W]` features of an image scaled to fit and centred with padding -> the rows and columns that
    show the image of `size` (height, width)."""
    height, width = size
    rows, cols = features.shape[1:]
    if width / height > cols / rows:
        pad = (rows - int(round(height * cols / width, 7))) // 2
        return features[:, pad: rows - pad, :]
    pad = (cols - int(round(width * rows / height, 7))) // 2
    return features[:, :, pad: cols - pad]


class AnyResSubmodules(ModalitySubmodules):
    """A vision modality for anyres images: `encoders` holds one ViT (its rows with the first token dropped if
    it is configured so), `input_projections` its projector, `image_newline` the LM-width newline row.

    Encoder inputs: `{"vit": {"pixel_values": [T, C, S, S], "image_sizes": [n, 2]}}`, the tiles of n images in
    order (each image's overview tile first, then its grid row by row, as transformers' processor gives them)
    and each image's (height, width). Returns the rows of all images, image by image."""

    def __init__(self, vit: nn.Module, projector: nn.Module, lm_hidden: int, grid_pinpoints: list[list[int]],
                 max_tiles: int = 0):
        """`max_tiles` (LLaVA-OneVision's anyres_max_N; 0 = no limit): a cropped grid of more than about N tiles'
        area is shrunk (bilinear) to that area. The newline row starts as LLaVA-NeXT's: normal, std 1/sqrt(width)."""
        super().__init__(encoders={"vit": vit}, input_projections=[projector])
        self.image_newline = nn.Parameter(torch.empty(lm_hidden))
        normal_(self.image_newline, lm_hidden**-0.5)
        self.grid_pinpoints = [list(p) for p in grid_pinpoints]
        self.max_tiles = max_tiles

    def tiles_of(self, size: tuple[int, int]) -> tuple[int, int]:
        """(rows, columns) of tiles an image of `size` is cut into (the overview tile not counted)."""
        tile = self.encoders["vit"].cfg.image
        h, w = select_best_resolution(size, self.grid_pinpoints)
        return h // tile, w // tile

    def forward(self, encoder_inputs: dict[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        inputs = encoder_inputs["vit"]
        sizes = [tuple(int(x) for x in s) for s in inputs["image_sizes"].tolist()]
        counts = [1 + r * c for r, c in map(self.tiles_of, sizes)]
        if sum(counts) != len(inputs["pixel_values"]):
            raise ValueError(f"image_sizes {sizes} need {sum(counts)} tiles ({counts}), but pixel_values holds "
                             f"{len(inputs['pixel_values'])}")
        vit = self.encoders["vit"]
        rows = self.project(vit(inputs["pixel_values"]))
        side = vit.cfg.image // vit.cfg.patch
        out = []
        for tiles, size in zip(rows.split(counts), sizes):
            r, c = self.tiles_of(size)
            grid = tiles[1:].view(r, c, side, side, -1).permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)
            grid = unpad(grid, size)
            ratio = math.sqrt(grid.shape[1] * grid.shape[2] / (self.max_tiles * side**2)) if self.max_tiles else 0.0
            if ratio > 1.1:  # OneVision's threshold, as transformers applies it
                grid = F.interpolate(grid[None], [int(grid.shape[1] // ratio), int(grid.shape[2] // ratio)],
                                     mode="bilinear")[0]
            newline = self.image_newline[:, None, None].expand(*grid.shape[:-1], 1).to(grid.dtype)
            grid = torch.cat([grid, newline], dim=-1).flatten(1, 2).transpose(0, 1)
            out.append(torch.cat([tiles[0], grid]))
        return torch.cat(out)
