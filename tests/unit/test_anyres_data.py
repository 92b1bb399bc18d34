"""An anyres run on real data (data.name = "jsonl"): a manifest of images of several sizes becomes batches whose
tiles equal transformers' LLaVA-NeXT image processor's and whose placeholder runs equal LlavaNextProcessor's
counts; corrupt samples (a missing image, a video) are skipped and counted; a few steps train in one process."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from mimo.config.schema import ConfigError
from mimo.data.anyres_data import AnyResImageTextData
from mimo.data.checks import check_batch
from mimo.data.make_shards import make_shards
from mimo.models.step_hints import forward_args
from mimo.tasks import build_demo_data
from mimo.train.gate import check_data_set
from mimo.train.trainer import Trainer
from tests.support.anyres_data import SIZES, jsonl, manifest
from tests.support.anyres_hf import hf_counts, hf_image_processor, hf_onevision_counts
from tests.support.tiny_run import tiny_config, train_losses

pytestmark = pytest.mark.usefixtures("one_thread")

PINPOINTS = [[16, 32], [32, 16], [32, 32]]
TOKEN = 259


def test_batches_hold_transformers_tiles_and_placeholder_counts(tmp_path):
    trainer = Trainer(tiny_config(tmp_path, *jsonl(tmp_path)))
    data, model = trainer.data, trainer.model
    assert isinstance(data, AnyResImageTextData)
    reader = data.reader(data)
    items = [reader[(r, r, True, frozenset({"images"}))] for r in range(9)]
    assert [it[5] for it in items] == [0.0] * 7 + [1.0, 1.0] and "video" in items[8][4]
    batch = data._assemble(items, 9, torch.tensor([it[5] > 0 for it in items]))
    check_batch(model, batch)
    inputs = batch["modality_inputs"]["images"]["vit"]
    order = [*range(5), 0, 1]  # the images in batch order
    ref = hf_image_processor("next", PINPOINTS, 16)([Image.open(tmp_path / f"i{k}.png") for k in order],
                                                    return_tensors="pt")
    assert inputs["image_sizes"].tolist() == ref["image_sizes"].tolist() == [list(SIZES[k]) for k in order]
    assert inputs["pixel_values"].shape == ref["pixel_values"].shape
    assert (inputs["pixel_values"] - ref["pixel_values"]).abs().max() <= 1e-6
    rows = hf_counts(0, SIZES, PINPOINTS, 16, 8)
    assert len(set(rows)) >= 3, rows  # several grids and crops among the sizes
    assert batch["modality_counts"]["images"].tolist() == [1, 1, 1, 1, 1, 2, 0, 0, 0]
    placeholders = (batch["input_ids"] == TOKEN).sum(1).tolist()
    assert placeholders == [*rows, rows[0] + rows[1], 0, 0, 0]
    two = [256] + [TOKEN] * (rows[0] + rows[1]) + list(b"two") + [257]
    assert batch["input_ids"][5, : len(two)].tolist() == two
    with torch.no_grad():
        out = model(**forward_args({k: v for k, v in batch.items() if k != "modality_counts"}))
    assert torch.isfinite(out.loss_sum)


def test_onevision_batches_give_a_several_image_sample_square_tiles(tmp_path):
    """Under anyres_max_9 the two-image sample's images are one mid-grey square tile each (transformers'
    `batch_num_images` rule): the tiles equal OneVision's image processor given the samples' image lists, the
    placeholder runs its processor's `replace_image_token` counts, and the batch says which images are tiled."""
    trainer = Trainer(tiny_config(tmp_path, *jsonl(tmp_path), "--model.modalities.images.anyres_max_tiles=9"))
    data, model = trainer.data, trainer.model
    reader = data.reader(data)
    items = [reader[(r, r, True, frozenset({"images"}))] for r in range(7)]
    batch = data._assemble(items, 7, torch.zeros(7, dtype=torch.bool))
    check_batch(model, batch)
    inputs = batch["modality_inputs"]["images"]["vit"]
    nested = [[Image.open(tmp_path / f"i{k}.png")] for k in range(5)] + [[Image.open(tmp_path / f"i{k}.png")
                                                                          for k in (0, 1)]]
    ref = hf_image_processor("onevision", PINPOINTS, 16)(nested, return_tensors="pt")
    assert inputs["tiled"].tolist() == [True] * 5 + [False, False]
    assert inputs["pixel_values"].shape == ref["pixel_values"].shape
    assert (inputs["pixel_values"] - ref["pixel_values"]).abs().max() <= 1e-6
    rows = hf_onevision_counts(ref, 9, PINPOINTS, 16, 8)
    assert rows[5:] == [5, 5]  # the overview tile's 4 rows and a newline row each
    assert (batch["input_ids"] == TOKEN).sum(1).tolist() == [*rows[:5], rows[5] + rows[6], 0]
    with torch.no_grad():
        out = model(**forward_args({k: v for k, v in batch.items() if k != "modality_counts"}))
    assert torch.isfinite(out.loss_sum)
    losses = train_losses(tmp_path / "run", *jsonl(tmp_path), "--model.modalities.images.anyres_max_tiles=9",
                          "--train.steps=2")
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses


def test_webdataset_shards_tile_as_the_manifest_does(tmp_path):
    """The five images as shards (mimo.data.make_shards, sorted by key): the same tiles and placeholders."""
    manifest(tmp_path)
    for k in range(5):
        (tmp_path / f"i{k}.txt").write_text(f"picture {k}")
    make_shards(tmp_path, tmp_path / "shards")
    batches = []
    for name, path in (("jsonl", manifest(tmp_path)), ("webdataset", str(tmp_path / "shards"))):
        trainer = Trainer(tiny_config(tmp_path / name, *jsonl(tmp_path), f"--data.name={name}", f"--data.path={path}"))
        reader = trainer.data.reader(trainer.data)
        batches.append(trainer.data._assemble([reader[(r, r, True, frozenset({"images"}))] for r in range(5)], 5,
                                              torch.zeros(5, dtype=torch.bool)))
    for key in ("input_ids", "labels"):
        assert torch.equal(batches[0][key], batches[1][key])
    for key in ("pixel_values", "image_sizes"):
        assert torch.equal(*(b["modality_inputs"]["images"]["vit"][key] for b in batches))


def test_an_anyres_run_trains_on_a_manifest_and_counts_its_corrupt_samples(tmp_path):
    losses = train_losses(tmp_path / "run", *jsonl(tmp_path), "--train.steps=4")
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses), losses
    summary = json.loads((tmp_path / "run" / "tiny" / "summary.json").read_text())
    assert summary["eval"]["data"]["corrupt_samples"] == 2


@pytest.mark.parametrize(("overrides", "message"), [
    (["--model.modalities.images.anyres_grid_pinpoints=[[32, 64]]", "--data.name=synthetic"],
     r"data.name = 'synthetic' does not tile images \(the shapes demo, jsonl and webdataset do\)"),
])
def test_data_that_cannot_tile_is_refused_naming_the_field(tmp_path, overrides, message):
    cfg = tiny_config(tmp_path, *jsonl(tmp_path), *overrides)
    with pytest.raises(ConfigError, match=message):
        check_data_set(cfg, cfg.model)


def test_a_jsonl_anyres_run_passes_the_data_checks(tmp_path):
    cfg = tiny_config(tmp_path, *jsonl(tmp_path))
    check_data_set(cfg, cfg.model)
    assert build_demo_data(cfg, Trainer(cfg).model).seq_len == 64
