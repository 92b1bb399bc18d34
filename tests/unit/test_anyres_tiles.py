"""Anyres tiling of the data pipeline (mimo.data.anyres_tiles) and its placeholder count
(mimo.models.anyres.anyres_rows) against transformers' LLaVA-NeXT / OneVision image processor and processors,
and against what AnyResSubmodules gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.config.schema import ModalityConfig, ModelConfig, ViTConfig
from mimo.data.anyres_tiles import tiled_inputs
from mimo.models.anyres import anyres_rows, tiled_images
from mimo.models.build import build_model
from tests.support.anyres_hf import PATCH, PINPOINTS, SIZES, TILE, hf_counts, hf_image_processor, hf_onevision_counts
from tests.support.configs import tiny_llm


def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]


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
