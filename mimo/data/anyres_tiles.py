"""LLaVA-NeXT's image preparation for anyres modalities (mimo.models.anyres): an image is scaled, aspect kept, to
fit the best of the grid pinpoints (`select_best_resolution`), centred on black padding to that resolution and cut
into tower-sized tiles row by row, after an overview tile (the whole image resized to the tower's size); every
tile bicubic and in mimo's [-1, 1] pixels. What transformers' LlavaNextImageProcessor (and OneVision's) gives
with the image processor mimo export writes (mimo.export.llava_next.anyres_image_processor). An image OneVision
does not tile (one of several in a prompt, mimo.models.anyres.tiled_images) is padded to a square of mid-grey
(the pixel mean) and resized to one tile, as LlavaOnevisionImageProcessor's `pad_to_square` does.
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
    canvas = centred(np.asarray(pil.resize((w, h), Image.BICUBIC)), target, 0)
    tiles = [np.asarray(pil.resize((tile, tile), Image.BICUBIC))]
    tiles += [canvas[i: i + tile, j: j + tile] for i in range(0, target[0], tile) for j in range(0, target[1], tile)]
    return np.stack([image_tensor_values(t) for t in tiles])


def square_tile(image: np.ndarray, tile: int) -> np.ndarray:
    """uint8 `[H, W, 3]` -> float32 `[1, 3, tile, tile]`: the image centred on a mid-grey (127) square of its longer
    side, resized (bicubic) to the tile, in [-1, 1]."""
    side = max(image.shape[:2])
    canvas = centred(image, (side, side), 127)
    return image_tensor_values(np.asarray(Image.fromarray(canvas).resize((tile, tile), Image.BICUBIC)))[None]


def centred(image: np.ndarray, shape: tuple[int, int], fill: int) -> np.ndarray:
    """uint8 `[h, w, 3]` -> uint8 `[*shape, 3]`: the image in the middle of a canvas of `fill` (any odd pixel of
    margin below and to the right)."""
    height, width = image.shape[:2]
    canvas = np.full((*shape, 3), fill, dtype=np.uint8)
    top, left = (shape[0] - height) // 2, (shape[1] - width) // 2
    canvas[top: top + height, left: left + width] = image
    return canvas


def image_tiles(image: np.ndarray, grid_pinpoints: list[list[int]], tile: int, tiled: bool = True) -> np.ndarray:
    """An image's tiles: its `tile_image` when `tiled`, else its one `square_tile` (mimo.models.anyres.tiled_images)."""
    return tile_image(image, grid_pinpoints, tile) if tiled else square_tile(image, tile)


def tiled_inputs(images: list[np.ndarray], grid_pinpoints: list[list[int]], tile: int,
                 tiled: list[bool] | None = None) -> dict[str, torch.Tensor]:
    """An anyres modality's ViT inputs for `images` (uint8 `[H, W, 3]` each): `pixel_values` `[n, most tiles, 3,
    tile, tile]`, each image's tiles zero-padded to the most, and `image_sizes` `[n, 2]` (height, width); so a
    batch splits by images as any encoder input (mimo.data.batching). With `tiled` (one flag an image), an image
    not tiled gets its `square_tile` and the inputs a `tiled` `[n]` bool tensor."""
    flags = [True] * len(images) if tiled is None else tiled
    tiles = [image_tiles(x, grid_pinpoints, tile, t) for x, t in zip(images, flags)]
    return stacked_tiles(tiles, [x.shape[:2] for x in images], tile, tiled)


def stacked_tiles(tiled: list[np.ndarray | None], sizes: list[tuple[int, int]], tile: int,
                  flags: list[bool] | None = None) -> dict[str, torch.Tensor]:
    """`tiled_inputs` of images already tiled (`image_tiles`) and of `sizes` (and, given, their `tiled` `flags`);
    an image of None tiles (one this rank does not encode) is all zeros."""
    most = max([len(t) for t in tiled if t is not None], default=1)
    pixels = torch.zeros(len(tiled), most, 3, tile, tile)
    for i, t in enumerate(tiled):
        if t is not None:
            pixels[i, : len(t)] = torch.from_numpy(t)
    out = {"pixel_values": pixels, "image_sizes": torch.tensor(sizes, dtype=torch.long).reshape(-1, 2)}
    return out if flags is None else {**out, "tiled": torch.tensor(flags, dtype=torch.bool)}
