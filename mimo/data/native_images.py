"""Qwen's image processor for native-resolution towers: each image (or video frame) resized, aspect kept, to sides
that are multiples of patch x merge and an area within [min_pixels, max_pixels] (`smart_resize`), scaled to
[0, 1] and normalised with CLIP's mean and std, then cut into the flat patch layout the tower takes (`patchify`,
transformers' Qwen2VLImageProcessor order). The grid, and so the token count, follows from the image's size
alone (`grid_of`), which the encoded file's header gives without decoding it; `item_ids` lays out its LM ids.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image

from mimo.config.schema import NativeViTConfig
from mimo.data.samples import BadSample, ImageRef

CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) nearest to the image's with both sides multiples of `factor` and an area within
    [min_pixels, max_pixels] (Qwen's rule). Raises BadSample for an aspect ratio over 200."""
    if max(height, width) / max(min(height, width), 1) > 200:
        raise BadSample(f"the image's aspect ratio ({height} x {width}) exceeds 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def grid_of(size: tuple[int, int], frames: int, cfg: NativeViTConfig) -> tuple[int, int, int]:
    """(temporal, rows, columns) patches of `frames` frames of `size` (height, width) after `smart_resize`."""
    h, w = smart_resize(*size, cfg.patch * cfg.merge, cfg.min_pixels, cfg.max_pixels)
    return -(-frames // cfg.temporal_patch), h // cfg.patch, w // cfg.patch


def tokens_of(grid: tuple[int, int, int], cfg: NativeViTConfig) -> int:
    """LM rows (placeholders) of an item of `grid`."""
    t, h, w = grid
    return t * h * w // cfg.merge**2


def item_ids(rows: int, token_id: int, cfg: NativeViTConfig) -> list[int]:
    """An item's LM ids: its `rows` placeholders, between the vision markers when `cfg` has them (transformers'
    Qwen2-VL layout, `<|vision_start|> <|image_pad|> x rows <|vision_end|>`)."""
    run = [token_id] * rows
    return [cfg.vision_start_token_id, *run, cfg.vision_end_token_id] if cfg.marked else run


HEADER_BYTES = 1 << 16
"""What `header_size` reads first: enough for a PNG's or a JPEG's header unless large metadata comes before it."""


def header_size(ref: ImageRef) -> tuple[int, int]:
    """(height, width) of an encoded image from its header (nothing decoded), read from the image's first
    HEADER_BYTES, or from all of it where the header does not open from them (the verdict is the whole image's).
    Raises BadSample."""
    try:
        with Image.open(io.BytesIO(ref.read(HEADER_BYTES))) as img:
            return img.height, img.width
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        pass
    try:
        with Image.open(io.BytesIO(ref.read())) as img:
            return img.height, img.width
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise BadSample(f"the image does not decode ({type(e).__name__}: {e})") from e


def open_rgb(ref: ImageRef) -> Image.Image:
    """An encoded image decoded to RGB at its own size. Raises BadSample."""
    try:
        with Image.open(io.BytesIO(ref.read())) as img:
            img.load()
            return img.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise BadSample(f"the image does not decode ({type(e).__name__}: {e})") from e


def load_frame(ref: ImageRef, size: tuple[int, int]) -> np.ndarray:
    """An encoded image -> float32 CHW at `size` (height, width): bicubic, / 255, CLIP-normalised."""
    rgb = open_rgb(ref).resize((size[1], size[0]), Image.BICUBIC)
    x = np.asarray(rgb, dtype=np.float32) / 255.0
    return ((x - CLIP_MEAN) / CLIP_STD).transpose(2, 0, 1)


def patchify(frames: np.ndarray, cfg: NativeViTConfig) -> np.ndarray:
    """`[F, C, H, W]` frames (an image: F = 1) -> `[t * h * w, C * T * P * P]` patches in the tower's order
    (temporal patch, merged row, merged column, row and column in the merge cell; each patch channel, frame,
    row, column). The last frame repeats to fill the last temporal patch."""
    f, c, height, width = frames.shape
    t_p, p, m = cfg.temporal_patch, cfg.patch, cfg.merge
    pad = -f % t_p
    if pad:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    gt, gh, gw = frames.shape[0] // t_p, height // p, width // p
    x = frames.reshape(gt, t_p, c, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * t_p * p * p), dtype=np.float32)


def load_item(refs: tuple[ImageRef, ...], cfg: NativeViTConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The patches and grid of an image (one ref) or a video (its frames, all of the first frame's size)."""
    size = header_size(refs[0])
    grid = grid_of(size, len(refs), cfg)
    target = (grid[1] * cfg.patch, grid[2] * cfg.patch)
    return patchify(np.stack([load_frame(r, target) for r in refs]), cfg), grid
