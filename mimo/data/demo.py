"""The demo vision-language task as token sequences: `<bos> <image>*N question answer <eos> <pad>...`
(N = the image's tokens x the sample's images; `modality_counts` says how many when the count varies). With grid
pinpoints each image is tiled as LLaVA-NeXT tiles it (mimo.data.anyres_tiles) and N counts an anyres modality's
rows per image (mimo.models.anyres.anyres_rows).

Labels are shifted here (position t holds the id of token t+1) and cover only the answer and its
end token, so the loss trains answering, not the question text. Every sequence is padded to one
fixed length, so shapes never depend on which samples a batch holds or how it is split.
"""

from __future__ import annotations

import numpy as np
import torch

from mimo.config.schema import Config
from mimo.data.anyres_tiles import tiled_inputs
from mimo.data.batching import COUNTS as MODALITY_COUNTS
from mimo.data.seeded_batches import SeededBatches
from mimo.data.shapes import (
    COLORS,
    COUNTS,
    IMAGE_SIZE,
    NO_IMAGE,
    QUESTIONS,
    SHAPES,
    Sample,
    image_tensor_values,
    make_samples,
)
from mimo.data.tokenizer import ByteTokenizer
from mimo.models.anyres import AnyResSubmodules
from mimo.models.loss import IGNORE_INDEX
from mimo.models.multimodal import MimoModel


def question_answer_rows(pairs: list[tuple[list[int], str]], seq_len: int,
                         tok: ByteTokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) `[B, seq_len]` for (prompt ids, answer) pairs: prompt, answer and EOS, padded;
    the loss is on the answer and EOS, each label at the position that predicts it."""
    ids = torch.full((len(pairs), seq_len), tok.PAD, dtype=torch.long)
    labels = torch.full((len(pairs), seq_len), IGNORE_INDEX, dtype=torch.long)
    for i, (prompt, text) in enumerate(pairs):
        answer = tok.encode(text) + [tok.EOS]
        seq = prompt + answer
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(prompt) - 1 : len(seq) - 1] = torch.tensor(answer)
    return ids, labels


def demo_row_length(image_tokens: int) -> int:
    """Tokens of every row of the shapes task for an image of `image_tokens` rows: the longest prompt and
    answer, padded to a multiple of 8 (so sequence- and context-parallel splits of up to 8 divide it)."""
    longest_q = max(len(q) for q in QUESTIONS.values())
    longest_a = max(len(a) for a in (*COLORS, *SHAPES, *COUNTS, NO_IMAGE))
    return -(-(1 + image_tokens + longest_q + longest_a + 1) // 8) * 8


class DemoVLMData(SeededBatches):
    """Train and held-out sets of the shapes task, tokenised, with a deterministic global order; each sample
    holds `images[0]..images[1]` images (one by default). `grid_pinpoints` (an anyres modality's, with `tile` its
    tower's image size) tiles every image; `image_tokens` is then the anyres rows of an IMAGE_SIZE image."""

    def __init__(self, train_samples: int, eval_samples: int, seed: int, image_tokens: int,
                 image_token_id: int, modality: str = "images", encoder: str = "vit",
                 images: tuple[int, int] = (1, 1), grid_pinpoints: list[list[int]] | None = None, tile: int = 0):
        self.tok = ByteTokenizer()
        self.image_tokens = image_tokens
        self.image_token_id = image_token_id
        self.modality, self.encoder = modality, encoder
        self.images = images
        self.grid_pinpoints, self.tile = grid_pinpoints, tile
        self.train = make_samples(train_samples, seed, images)
        self.eval = make_samples(eval_samples, seed + 1_000_003, images)
        self.seq_len = demo_row_length(image_tokens * images[1])

    def prompt_ids(self, s: Sample) -> list[int]:
        placeholders = [self.image_token_id] * (self.image_tokens * len(s.images))
        return [self.tok.BOS] + placeholders + self.tok.encode(s.question)

    def collate(self, samples: list[Sample]) -> dict:
        """Samples -> a batch dict of tensors, the keyword arguments of MimoModel.forward (plus
        `modality_counts` unless every sample holds exactly one image)."""
        b, s = len(samples), self.seq_len
        ids, labels = question_answer_rows([(self.prompt_ids(x), x.answer) for x in samples], s, self.tok)
        batch = {
            "input_ids": ids,
            "labels": labels,
            "position_ids": torch.arange(s).expand(b, s).contiguous(),
            "modality_inputs": {self.modality: {self.encoder: self.pixel_inputs(samples)}},
        }
        if self.images != (1, 1):
            batch[MODALITY_COUNTS] = {self.modality: torch.tensor([len(x.images) for x in samples])}
        return batch

    def pixel_inputs(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        """The encoder inputs of the samples' images in order: `pixel_values` `[n, 3, H, W]`, or an anyres
        modality's tiles and sizes (mimo.data.anyres_tiles.tiled_inputs)."""
        images = [image for x in samples for image in x.images]
        if self.grid_pinpoints:
            return tiled_inputs(images, self.grid_pinpoints, self.tile)
        pixels = [image_tensor_values(image) for image in images]
        return {"pixel_values": torch.from_numpy(np.stack(pixels)) if pixels else
                torch.zeros(0, 3, IMAGE_SIZE, IMAGE_SIZE)}


def build_shapes_data(cfg: Config, model: MimoModel) -> DemoVLMData:
    """The data set for data.name = "shapes": one vision modality, its images tiled if it is an anyres one."""
    if len(cfg.model.modalities) != 1:
        raise ValueError("the shapes demo needs exactly one vision modality under model.modalities")
    (name, mcfg), = cfg.model.modalities.items()
    sub = model.modality_submodules[name]
    vit = sub.encoders["vit"]
    if isinstance(sub, AnyResSubmodules):
        return DemoVLMData(cfg.data.train_samples, cfg.data.eval_samples, cfg.data.seed,
                           sub.rows_of((IMAGE_SIZE, IMAGE_SIZE)), mcfg.token_id, modality=name,
                           images=cfg.data.images_range, grid_pinpoints=sub.grid_pinpoints, tile=vit.cfg.image)
    return DemoVLMData(cfg.data.train_samples, cfg.data.eval_samples, cfg.data.seed, vit.tokens_per_image,
                       mcfg.token_id, modality=name, images=cfg.data.images_range)
