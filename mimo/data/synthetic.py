"""Random tokens and random images of fixed shapes: a data set for measuring throughput, not for learning.

`data.name = "synthetic"`: every sample is `data.seq_len` tokens, the placeholders of its
`data.images_per_sample` images first (as the benchmark presets lay a sample out), then random text
ids; with `data.min_images_per_sample` each sample draws its count from that range (0: text only). The
loss covers the text only: each label sits at the position that predicts it, so the last placeholder
predicts the first text token. With a fixed count, shapes never change, so every step costs the same.

The global batch at a step is a pure function of (seed, step, batch size), so every layout sees the
same tokens and images; the trainer cuts it into its own lanes as for any data set. A step's images
are a window at a random offset into a pool of random images made once per batch size: drawing
fresh pixels (or gathering them) every step would cost the host a sizeable part of a small model's
step, and an encoder's cost does not depend on pixel values.
"""

from __future__ import annotations

import numpy as np
import torch

from mimo.config.schema import Config
from mimo.data.batching import COUNTS
from mimo.models.loss import IGNORE_INDEX
from mimo.models.multimodal import MimoModel

POOL_SLACK = 64
"""Images beyond one batch's in the pool: how many different windows (offsets) a step can pick from."""


class SyntheticData:
    """The trainer's data interface (`global_batch(step, size, seed)`) over random samples; each sample holds
    `images[0]..images[1]` images (drawn per sample when they differ)."""

    def __init__(self, seq_len: int, images: tuple[int, int], image_tokens: int, image_token_id: int,
                 image_shape: tuple[int, int, int], vocab: int, reserved_ids: set[int], modality: str = "images",
                 repeat_batches: int = 0):
        placeholders = images[1] * image_tokens
        if seq_len <= placeholders:
            raise ValueError(f"data.seq_len ({seq_len}) must exceed data.images_per_sample ({images[1]}) x "
                             f"the image's {image_tokens} tokens = {placeholders}, to leave text to predict; raise "
                             "data.seq_len or lower data.images_per_sample")
        self.seq_len, self.images, self.image_tokens = seq_len, images, image_tokens
        self.image_token_id, self.image_shape = image_token_id, image_shape
        self.modality, self.repeat_batches = modality, repeat_batches
        # Text never uses a placeholder or generation id, which would turn it into a modality position.
        self.text_ids = torch.tensor(sorted(set(range(vocab)) - reserved_ids), dtype=torch.long)
        self._pools: dict[tuple[int, int], torch.Tensor] = {}

    def _pool(self, images: int, seed: int) -> torch.Tensor:
        key = (images, seed)
        if key not in self._pools:
            gen = torch.Generator().manual_seed(seed)
            self._pools[key] = torch.randn(images + POOL_SLACK, *self.image_shape, generator=gen)
        return self._pools[key]

    def _draw_rows(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, torch.Tensor]:
        """(images per sample `[n]`, text vocabulary indices `[n, seq_len]`, placeholder columns unused)."""
        (lo, hi), s, t = self.images, self.seq_len, self.image_tokens
        if lo == hi:  # the fixed layout draws only the text columns
            drawn = rng.integers(0, len(self.text_ids), (n, s - hi * t))
            text = np.concatenate([np.zeros((n, hi * t), np.int64), drawn], axis=1)
            return np.full(n, hi), torch.from_numpy(text)
        text = rng.integers(0, len(self.text_ids), (n, s))
        return rng.integers(lo, hi + 1, n), torch.from_numpy(text)

    def global_batch(self, step: int, global_batch: int, seed: int) -> dict:
        """The batch at `step` (of step mod `repeat_batches` where that is > 0): the same on every rank and
        every layout."""
        if self.repeat_batches:
            step %= self.repeat_batches
        n, s = global_batch, self.seq_len
        rng = np.random.default_rng([seed, step])
        counts, text = self._draw_rows(rng, n)
        placeholders = torch.from_numpy(counts * self.image_tokens)
        columns = torch.arange(s)
        ids = torch.where(columns < placeholders[:, None], self.image_token_id, self.text_ids[text])
        labels = torch.full((n, s), IGNORE_INDEX, dtype=torch.long)
        labels[:, :-1] = torch.where(columns[1:] >= placeholders[:, None], ids[:, 1:], IGNORE_INDEX)
        offset = int(rng.integers(0, POOL_SLACK + 1))
        pixels = self._pool(n * self.images[1], seed)[offset : offset + int(counts.sum())]
        return {"input_ids": ids, "labels": labels, "position_ids": columns.expand(n, s).contiguous(),
                "modality_inputs": {self.modality: {"vit": {"pixel_values": pixels}}},
                COUNTS: {self.modality: torch.from_numpy(counts).long()}}


def build_synthetic_data(cfg: Config, model: MimoModel) -> SyntheticData:
    """The data set for `data.name = "synthetic"` (one vision modality)."""
    if [m.kind for m in cfg.model.modalities.values()] != ["vision"]:
        raise ValueError("data.name = 'synthetic' needs exactly one modality under model.modalities, of kind 'vision'")
    (name, m), = cfg.model.modalities.items()
    vit = model.modality_submodules[name].encoders["vit"]
    reserved = {*model.special_token_ids.values(), *model.output_token_ids.values()}
    return SyntheticData(cfg.data.seq_len, cfg.data.images_range, vit.tokens_per_image, m.token_id,
                         (vit.cfg.channels, vit.cfg.image, vit.cfg.image), model.language_model.cfg.vocab, reserved,
                         modality=name, repeat_batches=cfg.data.repeat_batches)


def evaluate_synthetic(model: MimoModel, data: SyntheticData) -> dict:
    """Random text has nothing to learn, so there is no held-out evaluation."""
    return {}
