"""Anyres tiling of the data pipeline (mimo.data.anyres_tiles) and its placeholder count
(mimo.models.anyres.anyres_rows) against transformers' LLaVA-NeXT / OneVision image processor and processors,
and against what AnyResSubmodules gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.config.schema import ModalityConfig, ModelConfig, ViTConfig
from mimo.data.anyres_tiles import tiled_inputs
from mimo.export.tokens import BICUBIC, PIXEL_MEAN, PIXEL_STD
from mimo.models.anyres import anyres_rows, tiled_images
from mimo.models.build import build_model
from tests.support.configs import tiny_llm

tf = pytest.importorskip("transformers")

TILE, PATCH = 32, 8
PINPOINTS = [[32, 64], [64, 32], [64, 64], [32, 96], [96, 96]]
SIZES = [(20, 40), (40, 24), (12, 44), (50, 50), (7, 100), (90, 31), (200, 180)]


def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]


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


@pytest.mark.parametrize("family", ["next", "onevision"])
def test_tiles_equal_transformers_image_processor(family):
    """The image processors as mimo export writes them (mimo's bicubic resize, [-1, 1] pixels)."""
    ref = hf_image_processor(family)([Image.fromarray(x) for x in images()], return_tensors="pt")
    got = tiled_inputs(images(), PINPOINTS, TILE)
    assert got["image_sizes"].tolist() == ref["image_sizes"].tolist() == [list(s) for s in SIZES]
    assert got["pixel_values"].shape == ref["pixel_values"].shape == (len(SIZES), 10, 3, TILE, TILE)
    assert (got["pixel_values"] - ref["pixel_values"]).abs().max() <= 1e-6


@pytest.mark.parametrize("max_tiles", [0, 9, 2, 1])
def test_placeholders_equal_transformers_processor_and_the_model(max_tiles):
    """anyres_max_2 and _1 shrink the larger grids; the model's rows per image are the same counts."""
    counts = [anyres_rows(s, TILE, PATCH, PINPOINTS, max_tiles, (TILE // PATCH) ** 2) for s in SIZES]
    assert counts == hf_counts(max_tiles)
    vit = ViTConfig(image=TILE, patch=PATCH, hidden=16, heads=2, mlp=24, drop_class_token=True)
    cfg = ModelConfig(llm=tiny_llm(vocab=80), modalities={"images": ModalityConfig(
        token_id=70, vit=vit, anyres_grid_pinpoints=PINPOINTS, anyres_max_tiles=max_tiles)})
    sub = build_model(cfg).modality_submodules["images"]
    inputs = tiled_inputs(images(), PINPOINTS, TILE)
    with torch.no_grad():
        rows = sub({"vit": inputs})
    assert sub.rows_per_input(inputs).tolist() == counts
    assert len(rows) == sum(counts)


def test_a_lane_of_no_image_runs_the_tower_on_a_stand_in():
    """Zero images give zero rows, yet the tower runs (so data-parallel ranks make the same collectives) and its
    gradient is exactly zero; on main at 17bcbd4 the ViT met a 0-image batch and raised."""
    vit = ViTConfig(image=TILE, patch=PATCH, hidden=16, heads=2, mlp=24, drop_class_token=True)
    cfg = ModelConfig(llm=tiny_llm(vocab=80), modalities={"images": ModalityConfig(
        token_id=70, vit=vit, anyres_grid_pinpoints=PINPOINTS)})
    sub = build_model(cfg).modality_submodules["images"]
    rows = sub({"vit": tiled_inputs([], PINPOINTS, TILE)})
    assert rows.shape == (0, 32)
    rows.sum().backward()
    grads = [p.grad for p in sub.encoders["vit"].parameters()]
    assert all(g is not None and not g.any() for g in grads)


@pytest.mark.parametrize("family", ["next", "onevision"])
def test_several_images_of_a_prompt_equal_transformers(family):
    """A prompt of two images of different sizes, then one of one: LLaVA-NeXT tiles all three; OneVision's image
    processor gives each of the two its mid-grey square overview tile only, and its processor counts that tile's
    rows plus a newline (`replace_image_token`), as do mimo's tiling and anyres_rows."""
    max_tiles = 9 if family == "onevision" else 0
    pics = images()[:3]
    ref = hf_image_processor(family)([[Image.fromarray(x) for x in pics[:2]], [Image.fromarray(pics[2])]],
                                     return_tensors="pt")
    tiled = tiled_images(max_tiles, [2, 1])
    assert tiled == ([False, False, True] if max_tiles else [True] * 3)
    got = tiled_inputs(pics, PINPOINTS, TILE, tiled)
    assert ref["pixel_values"].shape == got["pixel_values"].shape
    assert (got["pixel_values"] - ref["pixel_values"]).abs().max() <= 1e-6
    counts = [anyres_rows(x.shape[:2], TILE, PATCH, PINPOINTS, max_tiles, (TILE // PATCH) ** 2, t)
              for x, t in zip(pics, tiled)]
    if max_tiles:
        assert ref["batch_num_images"].tolist() == [2, 1]
        want = hf_onevision_counts(ref, max_tiles)
    else:
        want = hf_counts(0, [x.shape[:2] for x in pics])
    assert counts == want and len(set(counts)) > 1
