"""The synthetic data set (data.name = "synthetic"): fixed shapes with the images' placeholders first, loss on
the text only, a batch that depends on (seed, step) alone."""

import pytest
import torch

from mimo.config.schema import ConfigError
from mimo.data.checks import check_batch
from mimo.data.synthetic import build_synthetic_data
from mimo.models.build import build_model
from mimo.models.loss import IGNORE_INDEX
from tests.support.tiny_run import SYNTHETIC, tiny_config

PLACEHOLDERS = 12


def test_batch_layout_and_determinism(tmp_path):
    cfg = tiny_config(tmp_path, *SYNTHETIC)
    model = build_model(cfg.model)
    data = build_synthetic_data(cfg, model)
    b = data.global_batch(3, 4, 7)
    ids, labels, token = b["input_ids"], b["labels"], cfg.model.modalities["images"].token_id
    assert ids.shape == labels.shape == b["position_ids"].shape == (4, 24)
    assert (ids[:, :PLACEHOLDERS] == token).all() and not (ids[:, PLACEHOLDERS:] == token).any()
    assert (labels[:, : PLACEHOLDERS - 1] == IGNORE_INDEX).all() and (labels[:, -1] == IGNORE_INDEX).all()
    assert torch.equal(labels[:, PLACEHOLDERS - 1 : -1], ids[:, PLACEHOLDERS:])
    assert b["modality_inputs"]["images"]["vit"]["pixel_values"].shape == (12, 3, 32, 32)
    assert b["modality_counts"]["images"].tolist() == [3, 3, 3, 3]
    check_batch(model, b)
    again = build_synthetic_data(cfg, model).global_batch(3, 4, 7)
    assert torch.equal(again["input_ids"], ids)
    assert torch.equal(again["modality_inputs"]["images"]["vit"]["pixel_values"],
                       b["modality_inputs"]["images"]["vit"]["pixel_values"])
    assert not torch.equal(data.global_batch(4, 4, 7)["input_ids"], ids)
    assert not torch.equal(data.global_batch(3, 4, 8)["input_ids"], ids)


def test_images_per_sample_drawn_from_a_range(tmp_path):
    """data.min_images_per_sample = 0: each sample holds 0..3 images, their placeholders first, then text."""
    cfg = tiny_config(tmp_path, *SYNTHETIC, "--data.min_images_per_sample=0")
    model = build_model(cfg.model)
    b = build_synthetic_data(cfg, model).global_batch(0, 16, 7)
    counts, ids, labels = b["modality_counts"]["images"], b["input_ids"], b["labels"]
    assert sorted(set(counts.tolist())) == [0, 1, 2, 3]
    assert b["modality_inputs"]["images"]["vit"]["pixel_values"].shape[0] == int(counts.sum())
    token = cfg.model.modalities["images"].token_id
    for row, k in enumerate(counts.tolist()):
        p = 4 * k
        assert (ids[row, :p] == token).all() and not (ids[row, p:] == token).any()
        assert torch.equal(labels[row, max(p - 1, 0) : -1], ids[row, max(p, 1) :])
        assert (labels[row, : max(p - 1, 0)] == IGNORE_INDEX).all()
    check_batch(model, b)


def test_repeated_batches_cycle(tmp_path):
    """data.repeat_batches = 2: step s trains on step s mod 2's batch (a loss that can fall)."""
    cfg = tiny_config(tmp_path, *SYNTHETIC, "--data.repeat_batches=2")
    data = build_synthetic_data(cfg, build_model(cfg.model))
    fresh = build_synthetic_data(tiny_config(tmp_path, *SYNTHETIC), build_model(cfg.model))
    for step in range(5):
        again, first = data.global_batch(step, 4, 7), fresh.global_batch(step % 2, 4, 7)
        assert torch.equal(again["input_ids"], first["input_ids"])
        assert torch.equal(again["modality_inputs"]["images"]["vit"]["pixel_values"],
                           first["modality_inputs"]["images"]["vit"]["pixel_values"])
    with pytest.raises(ConfigError, match=r"data.repeat_batches = 2: .* read by data.name = 'synthetic' only"):
        tiny_config(tmp_path, "--data.repeat_batches=2")


def test_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"data.images_per_sample \(0\) must be >= 1"):
        tiny_config(tmp_path, *SYNTHETIC, "--data.images_per_sample=0")
    with pytest.raises(ConfigError, match="are read by data.name = 'synthetic' and 'shapes' only"):
        tiny_config(tmp_path, *SYNTHETIC, "--data.name=avlm")
    with pytest.raises(ConfigError, match=r"data.min_images_per_sample \(4\) must lie in 0..data.images_per_sample"):
        tiny_config(tmp_path, *SYNTHETIC, "--data.min_images_per_sample=4")
    with pytest.raises(ConfigError, match="data.packing = true with data.name = 'synthetic'"):
        tiny_config(tmp_path, *SYNTHETIC, "--data.packing=true", "--data.pack_length=512")
    cfg = tiny_config(tmp_path, *SYNTHETIC, "--data.seq_len=8")
    with pytest.raises(ValueError, match=r"data.seq_len \(8\) must exceed data.images_per_sample \(3\)"):
        build_synthetic_data(cfg, build_model(cfg.model))
