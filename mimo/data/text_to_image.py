"""The text-to-image demo: from "draw a red square" or "a blue circle on the left", produce the picture.

A sequence is `<bos> prompt <gen>*P <eos> <pad>...`: P generation tokens (the modality's
`output_token_id`, the tokenizer's GENERATE_IMAGE) stand for the P patches of the image, and the
LM's states there are decoded into pixels (the Out path). The text labels teach the LM to open the
image after the prompt (the first <gen>) and to close it (<eos>); the image itself is the
modality target: the true rendering as patches, sample-aligned `[B, P, D]`.

Images are 4 colours x 4 shapes x 5 placements (centre, left, right, top, bottom) with jittered
position (+-1 px), size and shade on a dark background, generated from a seed (nothing is
downloaded). The jitter is kept small on purpose: a squared-error decoder learns the average image
for a prompt, and a smaller spread keeps that average a recognisable shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

from mimo.config.schema import Config, DecoderConfig
from mimo.data.seeded_batches import SeededBatches
from mimo.data.shapes import COLORS, SHAPES, draw_shape, image_tensor_values
from mimo.data.tokenizer import ByteTokenizer
from mimo.models.decoders import image_to_patches
from mimo.models.loss import IGNORE_INDEX
from mimo.models.multimodal import MimoModel

# Shape centre as a fraction of the image side; "center" also draws a larger shape.
PLACES = {"center": (0.5, 0.5), "left": (0.27, 0.5), "right": (0.73, 0.5), "top": (0.5, 0.27),
          "bottom": (0.5, 0.73)}


@dataclass
class Drawing:
    prompt: str
    image: np.ndarray  # uint8 [H, W, 3]
    color: str
    shape: str
    place: str


def prompt_for(color: str, shape: str, place: str) -> str:
    return f"draw a {color} {shape}" if place == "center" else f"a {color} {shape} on the {place}"


def render_drawing(color: str, shape: str, place: str, rng: np.random.Generator, size: int) -> np.ndarray:
    img = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(0, 40, 3)))
    fx, fy = PLACES[place]
    r = size * (rng.uniform(0.25, 0.28) if place == "center" else rng.uniform(0.17, 0.19))
    cx = fx * size + rng.uniform(-1.0, 1.0)
    cy = fy * size + rng.uniform(-1.0, 1.0)
    shade = np.clip(np.array(COLORS[color]) + rng.integers(-25, 26, 3), 0, 255)
    draw_shape(ImageDraw.Draw(img), shape, cx, cy, r, tuple(int(v) for v in shade))
    return np.asarray(img, dtype=np.uint8)


def make_drawings(n: int, seed: int, size: int) -> list[Drawing]:
    """`n` drawings; the 80 (colour, shape, placement) classes cycle so they are balanced."""
    rng = np.random.default_rng(seed)
    classes = [(c, s, p) for c in COLORS for s in SHAPES for p in PLACES]
    order = rng.permutation(len(classes))
    out = []
    for i in range(n):
        c, s, p = classes[order[i % len(classes)]]
        out.append(Drawing(prompt_for(c, s, p), render_drawing(c, s, p, rng, size), c, s, p))
    return out


def text_to_image_row_length(image_tokens: int) -> int:
    """Tokens of every row of the text-to-image task (the longest prompt, then `image_tokens` generation
    tokens), padded to a multiple of 8."""
    longest = max(len(prompt_for(c, s, p)) for c in COLORS for s in SHAPES for p in PLACES)
    return -(-(1 + longest + image_tokens + 1) // 8) * 8


class TextToImageData(SeededBatches):
    """Train and held-out drawings, tokenised with generation placeholders and patch targets."""

    def __init__(self, train_samples: int, eval_samples: int, seed: int, decoder: DecoderConfig,
                 output_token_id: int, modality: str = "images"):
        if decoder.channels != 3:
            raise ValueError(f"the text-to-image demo draws RGB images; set model.modalities.{modality}.decoder."
                             f"channels = 3 (got {decoder.channels})")
        self.tok = ByteTokenizer()
        self.decoder = decoder
        self.modality = modality
        self.output_token_id = output_token_id
        self.tokens_per_image = (decoder.image // decoder.patch) ** 2
        self.train = make_drawings(train_samples, seed, decoder.image)
        self.eval = make_drawings(eval_samples, seed + 1_000_003, decoder.image)
        self.seq_len = text_to_image_row_length(self.tokens_per_image)

    def prompt_ids(self, prompt: str) -> list[int]:
        """What generation feeds the model: `<bos> prompt <gen>*P`."""
        return [self.tok.BOS, *self.tok.encode(prompt)] + [self.output_token_id] * self.tokens_per_image

    def collate(self, samples: list[Drawing]) -> dict:
        b, s = len(samples), self.seq_len
        ids = torch.full((b, s), self.tok.PAD, dtype=torch.long)
        labels = torch.full((b, s), IGNORE_INDEX, dtype=torch.long)
        for i, smp in enumerate(samples):
            seq = self.prompt_ids(smp.prompt) + [self.tok.EOS]
            ids[i, : len(seq)] = torch.tensor(seq)
            first_gen = len(seq) - 1 - self.tokens_per_image
            labels[i, first_gen - 1] = self.output_token_id
            labels[i, len(seq) - 2] = self.tok.EOS
        pixels = torch.from_numpy(np.stack([image_tensor_values(x.image) for x in samples]))
        return {
            "input_ids": ids,
            "labels": labels,
            "position_ids": torch.arange(s).expand(b, s).contiguous(),
            "modality_targets": {self.modality: image_to_patches(pixels, self.decoder.patch)},
        }


def build_text_to_image_data(cfg: Config, model: MimoModel) -> TextToImageData:
    """The data set for `data.name = "text_to_image"`: needs one modality with an Out path. (`model` is
    the demo-set builders' common argument; the config says all this set needs.)"""
    outs = [(n, m) for n, m in cfg.model.modalities.items() if m.output_token_id >= 0]
    if len(outs) != 1:
        raise ValueError("data.name = 'text_to_image' needs exactly one modality with an Out path; set "
                         "model.modalities.<name>.output_token_id (e.g. 261) on one modality")
    (name, m), = outs
    return TextToImageData(cfg.data.train_samples, cfg.data.eval_samples, cfg.data.seed, m.decoder,
                           m.output_token_id, modality=name)
