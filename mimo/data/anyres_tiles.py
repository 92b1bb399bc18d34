"""LLaVA-NeXT's image preparation for anyres modalities (mimo.models.anyres): an image is scaled, aspect kept, to
fit the best of the grid pinpoints (`select_best_resolution`), centred on black padding to that resolution and cut
into tower-sized tiles row by row, after an overview tile (the whole image resized to the tower's size); every
tile bicubic and in mimo's [-1, 1] pixels. What transformers' LlavaNextImageProcessor (and OneVision's) gives
with the image processor mimo export writes (mimo.export.llava_next.anyres_image_processor).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from mimo.data.shapes import image_tensor_values
from mimo.models.anyres import select_best_resolution


def fit_size(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """(height, width) an image of `size` is resized to so that it fits `target`, aspect kept (transformers'
    get_patch_output_size: the tighter side fills the target, the other rounds up)."""
    (height, width), (th, tw) = size, target
    if tw / width < th / height:
        return min(math.ceil(height * tw / width), th), tw
    return th, min(math.ceil(width * th / height), tw)


def tile_image(image: np.ndarray, grid_pinpoints: list[list[int]], tile: int) -> np.ndarray:
    """uint8 `[H, W, 3]` -> float32 `[1 + rows * cols, 3, tile, tile]`: the overview tile, then the grid's tiles
    row by row, in [-1, 1]."""
    pil = Image.fromarray(image)
    target = select_best_resolution(image.shape[:2], grid_pinpoints)
    h, w = fit_size(image.shape[:2], target)
    resized = np.asarray(pil.resize((w, h), Image.BICUBIC))
    top, left = (target[0] - h) // 2, (target[1] - w) // 2
    canvas = np.zeros((*target, 3), dtype=np.uint8)
    canvas[top: top + h, left: left + w] = resized
    tiles = [np.asarray(pil.resize((tile, tile), Image.BICUBIC))]
    tiles += [canvas[i: i + tile, j: j + tile] for i in range(0, target[0], tile) for j in range(0, target[1], tile)]
    return np.stack([image_tensor_values(t) for t in tiles])


def tiled_inputs(images: list[np.ndarray], grid_pinpoints: list[list[int]], tile: int) -> dict[str, torch.Tensor]:
    """An anyres modality's ViT inputs for `images` (uint8 `[H, W, 3]` each): `pixel_values` `[n, most tiles, 3,
    tile, tile]`, each image's tiles zero-padded to the most, and `image_sizes` `[n, 2]` (height, width); so a
    batch splits by images as any encoder input (mimo.data.batching)."""
    tiled = [tile_image(x, grid_pinpoints, tile) for x in images]
    return stacked_tiles(tiled, [x.shape[:2] for x in images], tile)


def stacked_tiles(tiled: list[np.ndarray | None], sizes: list[tuple[int, int]], tile: int) -> dict[str, torch.Tensor]:
    """`tiled_inputs` of images already tiled (`tile_image`) and of `sizes`; an image of None tiles (one this rank
    does not encode) is all zeros."""
    most = max([len(t) for t in tiled if t is not None], default=1)
    pixels = torch.zeros(len(tiled), most, 3, tile, tile)
    for i, t in enumerate(tiled):
        if t is not None:
            pixels[i, : len(t)] = torch.from_numpy(t)
    return {"pixel_values": pixels, "image_sizes": torch.tensor(sizes, dtype=torch.long).reshape(-1, 2)}
