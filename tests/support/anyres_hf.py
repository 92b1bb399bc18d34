"""What transformers' LLaVA-NeXT and OneVision processors count and produce: the any-resolution oracle."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mimo.export.tokens import BICUBIC, PIXEL_MEAN, PIXEL_STD

tf = pytest.importorskip("transformers")

TILE, PATCH = 32, 8
PINPOINTS = [[32, 64], [64, 32], [64, 64], [32, 96], [96, 96]]
SIZES = [(20, 40), (40, 24), (12, 44), (50, 50), (7, 100), (90, 31), (200, 180)]


def hf_counts(max_tiles: int, sizes: list[tuple[int, int]] = SIZES, pinpoints: list[list[int]] = PINPOINTS,
              tile: int = TILE, patch: int = PATCH) -> list[int]:
    """Placeholders per image of `sizes` as LlavaNextProcessor (max_tiles 0) or LlavaOnevisionProcessor count them,
    with every patch of every tile kept ("full", no class token), as mimo export writes them."""
    side = tile // patch
    ns = SimpleNamespace(image_processor=SimpleNamespace(image_grid_pinpoints=pinpoints), patch_size=patch,
                         num_additional_image_tokens=0, num_image_tokens=side**2,
                         vision_aspect_ratio=f"anyres_max_{max_tiles}")
    cls = tf.LlavaOnevisionProcessor if max_tiles else tf.LlavaNextProcessor
    ns._get_unpadded_features = cls._get_unpadded_features.__get__(ns)
    return [cls._get_number_of_features(ns, h, w, tile, tile) for h, w in sizes]


def hf_onevision_counts(processed, max_tiles: int, pinpoints: list[list[int]] = PINPOINTS, tile: int = TILE,
                        patch: int = PATCH) -> list[int]:
    """Placeholders per image of an image processor's batch `processed` (its `batch_num_images` saying which
    images share a prompt) as LlavaOnevisionProcessor's `replace_image_token` expands each `<image>`."""
    ns = SimpleNamespace(num_image_tokens=(tile // patch) ** 2, vision_feature_select_strategy="full", image_token="x",
                         _get_number_of_features=lambda h, w, *_: hf_counts(max_tiles, [(h, w)], pinpoints, tile,
                                                                            patch)[0])
    images = len(processed["image_sizes"])
    return [len(tf.LlavaOnevisionProcessor.replace_image_token(ns, processed, i)) for i in range(images)]


def hf_image_processor(family: str, pinpoints: list[list[int]] = PINPOINTS, tile: int = TILE):
    """LLaVA-NeXT's (or OneVision's) image processor as mimo export writes it (bicubic, [-1, 1] pixels)."""
    size = {"height": tile, "width": tile}
    common = dict(size=size, image_grid_pinpoints=pinpoints, resample=BICUBIC, image_mean=PIXEL_MEAN,
                  image_std=PIXEL_STD, rescale_factor=1 / 255, do_convert_rgb=True, do_pad=True)
    if family == "next":
        return tf.LlavaNextImageProcessorPil(crop_size=size, do_center_crop=True, **common)
    return tf.LlavaOnevisionImageProcessorPil(**common)
