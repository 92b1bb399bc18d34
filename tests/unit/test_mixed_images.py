"""Batches mix text-only samples and samples of several images."""

from __future__ import annotations

import torch

from mimo.data.demo import DemoVLMData
from tests.support.tiny_run import MIXED_IMAGES, tiny_config


def test_batches_mix_text_only_and_several_images(tmp_path):
    cfg = tiny_config(tmp_path, *MIXED_IMAGES)
    data = DemoVLMData(cfg.data.train_samples, 4, cfg.data.seed, 5, 260, images=cfg.data.images_range)
    counts = [len(s.images) for s in data.train]
    assert sorted(set(counts)) == [0, 1, 2, 3]
    assert all(s.answer == "none" for s in data.train if not s.images)
    batch = data.global_batch(0, 8, cfg.data.seed)
    per_sample = batch["modality_counts"]["images"]
    assert batch["modality_inputs"]["images"]["vit"]["pixel_values"].shape[0] == int(per_sample.sum())
    assert torch.equal((batch["input_ids"] == 260).sum(1), per_sample * 5)
    # The parity runs' first step gives one fan-in encoder lane (2 samples) no image: its empty stand-in runs.
    assert 0 in [int(per_sample[i : i + 2].sum()) for i in range(0, 8, 2)]
