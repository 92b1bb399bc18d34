"""An anyres run on the shapes demo (data.name = "shapes"): each image tiled as LLaVA-NeXT tiles it, with the
placeholders AnyResSubmodules gives it, trains in one process; the gate refuses the data sets and layouts that
do not tile."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mimo.config.schema import ConfigError
from mimo.config.validate import validate
from mimo.data.anyres_tiles import tiled_inputs
from mimo.data.checks import check_batch
from mimo.parallel.layout import Layout
from mimo.tasks import build_demo_data
from mimo.train.gate import check_layout
from mimo.train.trainer import Trainer
from tests.support.anyres_run import ANYRES, ANYRES_ROWS
from tests.support.tiny_run import tiny_config, train_losses

LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"


def test_shapes_batches_hold_tiles_and_the_models_rows(tmp_path):
    trainer = Trainer(tiny_config(tmp_path, *ANYRES, "--data.images_per_sample=2", "--data.min_images_per_sample=0"))
    data, sub = trainer.data, trainer.model.modality_submodules["images"]
    batch = data.global_batch(0, 4, 0)
    inputs = batch["modality_inputs"]["images"]["vit"]
    n = int(batch["modality_counts"]["images"].sum())
    assert inputs["pixel_values"].shape == (n, 5, 3, 16, 16) and inputs["image_sizes"].tolist() == [[32, 32]] * n
    assert sub.rows_of((32, 32)) == ANYRES_ROWS
    placeholders = (batch["input_ids"] == trainer.cfg.model.modalities["images"].token_id).sum(1)
    assert torch.equal(placeholders, batch["modality_counts"]["images"] * ANYRES_ROWS)
    sample = next(s for s in data.train if s.images)
    tiles = tiled_inputs(sample.images[:1], [[16, 32], [32, 16], [32, 32]], 16)["pixel_values"][0]
    assert torch.equal(tiles, data.pixel_inputs([sample])["pixel_values"][0])
    assert torch.equal(tiles[1:].reshape(2, 2, 3, 16, 16).permute(2, 0, 3, 1, 4).reshape(3, 32, 32),
                       torch.from_numpy(sample.images[0].copy()).permute(2, 0, 1).float() / 127.5 - 1)
    assert build_demo_data(trainer.cfg, trainer.model).seq_len == data.seq_len


def test_an_anyres_run_trains_in_one_process(tmp_path):
    losses = train_losses(tmp_path, *ANYRES, "--train.steps=12")
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses


def test_a_packed_anyres_run_has_the_padded_runs_losses(tmp_path):
    """Packing moves each sample's tiles with its rows: 0..2 images per sample, packed or padded, same losses."""
    mixed = [*ANYRES, "--train.steps=3", "--data.images_per_sample=2", "--data.min_images_per_sample=0"]
    padded = train_losses(tmp_path / "padded", *mixed)
    packed = train_losses(tmp_path / "packed", *mixed, "--data.packing=true", "--data.pack_length=128")
    assert len(packed) == len(padded) == 3
    padding = json.loads((tmp_path / "packed" / "tiny" / "summary.json").read_text())["padding"]
    assert padding["padding_after"] < padding["padding_before"], padding
    for step, (a, b) in enumerate(zip(packed, padded)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: packed {a} vs padded {b}"


@pytest.mark.parametrize(("world", "overrides", "message"), [
    (2, [f"{IMG}.tp=2"], r"not with parallel.modules.images.tp = 2"),
    (3, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2",
         "--model.llm.layers=2"],
     r"not with parallel.modules.language.pp = 2"),
    (2, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=1"],
     r"not with parallel.modules.images on ranks of its own \(non-colocated\)"),
])
def test_layouts_that_split_tiles_are_refused(tmp_path, world, overrides, message):
    cfg = tiny_config(tmp_path, *ANYRES, *overrides)
    layout = Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world)
    with pytest.raises(ConfigError, match=r"model.modalities.images.anyres_grid_pinpoints trains on colocated "
                                          r"data-parallel layouts only, " + message):
        check_layout(cfg, layout)


def test_data_parallel_layouts_pass_the_gate(tmp_path):
    for overrides in ([], [f"{LANG}.tp=2", "--model.llm.kv_heads=2"]):
        cfg = tiny_config(tmp_path, *ANYRES, *overrides)
        check_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))


def test_placeholders_short_of_an_images_rows_are_refused_before_any_collective(tmp_path):
    trainer = Trainer(tiny_config(tmp_path, *ANYRES))
    batch = trainer.data.global_batch(0, 4, 0)
    check_batch(trainer.model, batch)
    ids = batch["input_ids"]
    ids[1, (ids[1] == trainer.cfg.model.modalities["images"].token_id).nonzero()[0]] = 0
    with pytest.raises(ValueError, match=rf"Number of images tokens \({ANYRES_ROWS - 1}\) does not match number of "
                                         rf"images embeddings \({ANYRES_ROWS}\) in sample 1"):
        check_batch(trainer.model, batch)


@pytest.mark.parametrize("override", ["--model.modalities.images.anyres_grid_pinpoints=[[16, 24]]",
                                      "--model.modalities.images.vit.drop_class_token=false"])
def test_pinpoints_of_partial_tiles_or_a_kept_class_token_are_refused(tmp_path, override):
    with pytest.raises(ConfigError, match=r"model.modalities.images.anyres_grid_pinpoints cuts images into whole "
                                          r"model.modalities.images.vit.image \(16\) tiles of 4 patch rows each"):
        validate(tiny_config(tmp_path, *ANYRES, override))
