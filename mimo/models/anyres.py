"""LLaVA-NeXT's "anyres" images: each image is tiled at the best of a set of resolutions (plus one overview
tile at the tower's size), every tile goes through the vision tower and the projector, and the tiles' rows are
put back in their places on the image, cropped to its aspect ratio, with a learned newline row closing each
line of patches. So an image gives a number of rows that depends on its size, as transformers'
LlavaNextForConditionalGeneration computes them ("spatial_unpad"); LLaVA-OneVision also shrinks a grid larger
than its anyres_max_N tiles' area, and gives each image of a several-image prompt only its overview tile (its
rows and one newline row; `tiled_images`), as transformers' LlavaOnevisionForConditionalGeneration does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mimo.models.init import normal_
from mimo.models.multimodal import ModalitySubmodules
from mimo.models.sample_rows import run_encoder


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


def grid_tiles(size: tuple[int, int], tile: int, grid_pinpoints: list[list[int]]) -> tuple[int, int]:
    """(rows, columns) of `tile`-pixel tiles an image of `size` (height, width) is cut into at the best of
    `grid_pinpoints` (the overview tile not counted): what mimo.data.anyres_tiles.tile_image cuts and
    AnyResSubmodules puts back."""
    h, w = select_best_resolution(size, grid_pinpoints)
    return h // tile, w // tile


def tile_count(size: tuple[int, int], tile: int, grid_pinpoints: list[list[int]], tiled: bool = True) -> int:
    """Tiles the tower encodes for an image of `size`: the overview tile and its grid (`grid_tiles`); the overview
    tile alone when not `tiled` (`tiled_images`)."""
    if not tiled:
        return 1
    rows, cols = grid_tiles(size, tile, grid_pinpoints)
    return 1 + rows * cols


def unpad_margins(rows: int, cols: int, size: tuple[int, int]) -> tuple[int, int]:
    """(rows, columns) of padding on each side of a `rows` x `cols` grid that an image of `size` (height, width)
    was scaled to fit and centred in (one of the two is 0)."""
    height, width = size
    if width / height > cols / rows:
        return (rows - int(round(height * cols / width, 7))) // 2, 0
    return 0, (cols - int(round(width * rows / height, 7))) // 2


def unpad(features: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """`[D, H, W]` features of an image scaled to fit and centred with padding -> the rows and columns that
    show the image of `size` (height, width)."""
    rows, cols = features.shape[1:]
    top, left = unpad_margins(rows, cols, size)
    return features[:, top: rows - top, left: cols - left]


def shrink_ratio(rows: int, cols: int, side: int, max_tiles: int) -> float:
    """OneVision's anyres_max_N: a `rows` x `cols` grid of patches larger than 1.1 x the side of `max_tiles`
    tiles of `side`^2 patches is shrunk by this ratio on each side; 0 (no shrink) otherwise or without a limit."""
    ratio = math.sqrt(rows * cols / (max_tiles * side**2)) if max_tiles else 0.0
    return ratio if ratio > 1.1 else 0.0  # OneVision's threshold, as transformers applies it


def tiled_images(max_tiles: int, images_per_prompt: list[int]) -> list[bool]:
    """Whether each image of prompts holding `images_per_prompt` images (in order) is tiled: always for
    LLaVA-NeXT (`max_tiles` 0); for OneVision only an image alone in its prompt, the others giving their overview
    tile (of the image padded to a square) and a newline row (transformers' `batch_num_images` rule)."""
    return [not (max_tiles and n > 1) for n in images_per_prompt for _ in range(n)]


def anyres_rows(size: tuple[int, int], tile: int, patch: int, grid_pinpoints: list[list[int]], max_tiles: int,
                tile_rows: int, tiled: bool = True) -> int:
    """Rows (placeholders) an image of `size` (height, width) gives AnyResSubmodules: the overview tile's
    `tile_rows`, then its grid of `tile`-pixel tiles of `patch`-pixel patches at the best pinpoint, unpadded,
    shrunk to `max_tiles` tiles' area (OneVision), each line closed by a newline row; not `tiled`, the overview
    tile's rows and one newline row. What transformers' LlavaNextProcessor / LlavaOnevisionProcessor count."""
    if not tiled:
        return tile_rows + 1
    side = tile // patch
    rows, cols = (n * side for n in grid_tiles(size, tile, grid_pinpoints))
    top, left = unpad_margins(rows, cols, size)
    rows, cols = rows - 2 * top, cols - 2 * left
    ratio = shrink_ratio(rows, cols, side, max_tiles)
    if ratio:
        rows, cols = int(rows // ratio), int(cols // ratio)
    return tile_rows + rows * (cols + 1)


class AnyResSubmodules(ModalitySubmodules):
    """A vision modality for anyres images: `encoders` holds one ViT (its rows with the first token dropped if
    it is configured so), `input_projections` its projector, `image_newline` the LM-width newline row.

    Encoder inputs: `{"vit": {"pixel_values": ..., "image_sizes": [n, 2], "tiled": [n]}}`, each of n images'
    (height, width), whether it is tiled (bool; all when absent; `tiled_images`) and its tiles (the overview tile
    first, then its grid row by row, as transformers' processor gives them; the overview tile alone when not
    tiled), either all in order, `[T, C, S, S]`, or one image a row, `[n, most tiles, C, S, S]` zero-padded after
    each image's own (transformers' batch layout, which splits by images). Returns the rows of all images, image
    by image (`rows_of` each)."""

    def __init__(self, vit: nn.Module, projector: nn.Module, lm_hidden: int, grid_pinpoints: list[list[int]],
                 max_tiles: int = 0):
        """`max_tiles` (LLaVA-OneVision's anyres_max_N; 0 = no limit): a cropped grid of more than about N tiles'
        area is shrunk (bilinear) to that area. The newline row starts as LLaVA-NeXT's: normal, std 1/sqrt(width)."""
        super().__init__(encoders={"vit": vit}, input_projections=[projector])
        self.image_newline = nn.Parameter(torch.empty(lm_hidden))
        normal_(self.image_newline, lm_hidden**-0.5)
        self.grid_pinpoints = [list(p) for p in grid_pinpoints]
        self.max_tiles = max_tiles

    def tiles_of(self, size: tuple[int, int], tiled: bool = True) -> tuple[int, int]:
        """(rows, columns) of tiles an image of `size` is cut into (the overview tile not counted; none when not
        `tiled`)."""
        return grid_tiles(size, self.encoders["vit"].cfg.image, self.grid_pinpoints) if tiled else (0, 0)

    def rows_of(self, size: tuple[int, int], tiled: bool = True) -> int:
        """Rows (placeholders) the modality gives an image of `size` (height, width), mimo.models.anyres.anyres_rows."""
        vit = self.encoders["vit"]
        return anyres_rows(size, vit.cfg.image, vit.cfg.patch, self.grid_pinpoints, self.max_tiles,
                           vit.tokens_per_image, tiled)

    def rows_per_input(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each image's rows, of the encoder inputs' `image_sizes` and `tiled` (what mimo.data.checks holds
        placeholders to)."""
        return torch.tensor([self.rows_of(s, t) for s, t in zip(*image_layout(inputs))], dtype=torch.long)

    def forward(self, encoder_inputs: dict[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        inputs = encoder_inputs["vit"]
        sizes, tiled = image_layout(inputs)
        counts = [tile_count(s, self.encoders["vit"].cfg.image, self.grid_pinpoints, t) for s, t in zip(sizes, tiled)]
        pixels = inputs["pixel_values"]
        if pixels.dim() == 5:
            pixels = torch.cat([p[:k] for p, k in zip(pixels, counts)]) if counts else pixels.flatten(0, 1)
        if sum(counts) != len(pixels):
            raise ValueError(f"image_sizes {sizes} need {sum(counts)} tiles ({counts}), but pixel_values holds "
                             f"{len(pixels)}")
        vit = self.encoders["vit"]
        rows = self.project(run_encoder(vit, {"pixel_values": pixels}, "vit"))  # no image: a stand-in runs
        side = vit.cfg.image // vit.cfg.patch
        out = []
        for tiles, size, whole in zip(rows.split(counts), sizes, tiled):
            if not whole:
                out.append(torch.cat([tiles[0], self.image_newline[None].to(tiles.dtype)]))
                continue
            r, c = self.tiles_of(size)
            grid = tiles[1:].view(r, c, side, side, -1).permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)
            grid = unpad(grid, size)
            ratio = shrink_ratio(grid.shape[1], grid.shape[2], side, self.max_tiles)
            if ratio:
                grid = F.interpolate(grid[None], [int(grid.shape[1] // ratio), int(grid.shape[2] // ratio)],
                                     mode="bilinear")[0]
            newline = self.image_newline[:, None, None].expand(*grid.shape[:-1], 1).to(grid.dtype)
            grid = torch.cat([grid, newline], dim=-1).flatten(1, 2).transpose(0, 1)
            out.append(torch.cat([tiles[0], grid]))
        return torch.cat(out) if out else rows.flatten(0, 1)


def image_layout(inputs: dict[str, torch.Tensor]) -> tuple[list[tuple[int, int]], list[bool]]:
    """(each image's (height, width), whether it is tiled) of AnyResSubmodules' encoder inputs, read to the host
    in one transfer (on a GPU, the forward's one sync)."""
    layout = inputs["image_sizes"]
    if "tiled" in inputs:
        layout = torch.cat([layout, inputs["tiled"].to(layout.dtype)[:, None]], dim=1)
    rows = layout.tolist()
    return [(int(r[0]), int(r[1])) for r in rows], [len(r) < 3 or bool(r[2]) for r in rows]
