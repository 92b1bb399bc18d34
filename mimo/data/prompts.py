"""Prompts for `mimo generate`: each a text with an optional image and clip, read from flags or a file, laid
out as training laid out its samples (`<bos> [<image>*N] [<audio>*k] text`; a native-resolution image with its
own grid's placeholders and M-RoPE positions), and checked for a question about an input it was not given."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from mimo.config.schema import Config, ConfigError
from mimo.data.anyres_tiles import tiled_inputs
from mimo.data.audio_demo import AUDIO_QUESTIONS, CLIP_SAMPLES
from mimo.data.audio_files import AudioDecodeError, decode_audio
from mimo.data.image_text import IMAGE_TEXT_SETS
from mimo.data.media import clip_samples
from mimo.data.native_images import load_item, tokens_of
from mimo.data.samples import BadSample, ImageRef
from mimo.data.shapes import QUESTIONS, image_tensor_values
from mimo.models.audio import AudioEncoder
from mimo.models.audio_features import WHISPER_HOP, WHISPER_SAMPLING_RATE, log_mel_spectrogram
from mimo.models.mrope import mrope_positions
from mimo.models.multimodal import MimoModel
from mimo.models.sample_rows import OUTPUT_LENGTHS

IMAGE_MARK, AUDIO_MARK = "<image>", "<audio>"
VISION_KINDS = ("vision", "native_vision")
ALWAYS_IMAGE_SETS = ("shapes", *IMAGE_TEXT_SETS)
"""Data sets whose every training sample holds an image: a prompt without one is unlike all of them."""


@dataclass(frozen=True)
class PromptRequest:
    text: str
    image: str | None = None
    audio: str | None = None


def pair_inputs(texts: list[str], images: list[str], clips: list[str]) -> list[PromptRequest]:
    """One request per text; `images` and `clips` give one per text or one for all (or none)."""
    for flag, given in (("--image", images), ("--audio", clips)):
        if given and len(given) not in (1, len(texts)):
            raise ConfigError(f"give one {flag} for every prompt, or one for all; got {len(given)} for "
                              f"{len(texts)} prompts")
    pick = lambda xs, i: (xs[i] if len(xs) > 1 else xs[0]) if xs else None
    return [PromptRequest(t, pick(images, i), pick(clips, i)) for i, t in enumerate(texts)]


def read_prompt_file(path: str | Path) -> tuple[list[str], list[PromptRequest]]:
    """`--prompts FILE`: (texts, []) for a text file of one prompt per non-empty line, or ([], requests) for a
    .jsonl file of {"prompt": ..., "image": ..., "audio": ...} objects (paths relative to the file)."""
    p = Path(path)
    lines = [(i + 1, line.strip()) for i, line in enumerate(p.read_text().splitlines()) if line.strip()]
    if not lines:
        raise ConfigError(f"--prompts file '{p}' holds no prompt")
    if p.suffix != ".jsonl":
        return [line for _, line in lines], []
    requests = []
    for number, line in lines:
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"--prompts '{p}' line {number} is not JSON ({e})") from e
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ConfigError(f"--prompts '{p}' line {number} needs a \"prompt\" string, e.g. "
                              '{"prompt": "what color?", "image": "a.png"}')
        media = {k: str(p.parent / row[k]) if row.get(k) else None for k in ("image", "audio")}
        requests.append(PromptRequest(row["prompt"], **media))
    return [], requests


def missing_input_warnings(cfg: Config, requests: list[PromptRequest]) -> list[str]:
    """A `mimo: warning:` line for each prompt that asks about an image or a sound it was not given: a demo
    question about one, a literal <image> / <audio>, or a data set whose every sample held one (real data
    holds every input the model takes; the shapes demo always an image)."""
    kinds = {m.kind for m in cfg.model.modalities.values()}
    out = []
    for r in requests:
        if kinds & set(VISION_KINDS) and r.image is None and (
                r.text in QUESTIONS.values() or IMAGE_MARK in r.text or cfg.data.name in ALWAYS_IMAGE_SETS):
            out.append(f"mimo: warning: the prompt {r.text!r} asks about an image but has none; give it with "
                       "--image (the answer below is a guess)")
        if "audio" in kinds and r.audio is None and (
                r.text in AUDIO_QUESTIONS.values() or AUDIO_MARK in r.text or cfg.data.name in IMAGE_TEXT_SETS):
            out.append(f"mimo: warning: the prompt {r.text!r} asks about a sound but has none; give it with "
                       "--audio (the answer below is a guess)")
    return out


def clip_length(cfg: Config, encoder: AudioEncoder) -> int:
    """Samples every clip is padded to, as in training: the audio demo's fixed length, else real data's
    (data.audio_seconds, or the longest clip the encoder takes)."""
    return CLIP_SAMPLES if cfg.data.name == "avlm" else clip_samples(cfg, encoder.cfg.max_positions)


def only_modality(cfg: Config, kinds: tuple[str, ...], flag: str, run: str) -> str:
    names = [n for n, m in cfg.model.modalities.items() if m.kind in kinds]
    if len(names) != 1:
        raise ConfigError(f"{flag} needs a run with exactly one {' or '.join(kinds)} modality; '{run}' has "
                          f"{len(names)}")
    return names[0]


def image_inputs(cfg: Config, model: MimoModel, name: str, paths: list[str]) -> tuple[dict, list[int]]:
    """(modality `name`'s encoder inputs for the images at `paths`, each image's placeholders), as training reads
    them: a fixed-size ViT's square bicubic resize, an anyres modality's tiles of the image at its own size
    (mimo.data.anyres_tiles), or a native-resolution tower's own grid within its [min_pixels, max_pixels]
    (mimo.data.native_images)."""
    m = cfg.model.modalities[name]
    if m.kind == "native_vision":
        try:
            items = [load_item((ImageRef(p),), m.native) for p in paths]
        except BadSample as e:
            raise ConfigError(f"--image: {e}") from e
        pixels = torch.from_numpy(np.concatenate([patches for patches, _ in items]))
        grids = torch.tensor([grid for _, grid in items], dtype=torch.long)
        return {"visual": {"pixel_values": pixels, "grid_thw": grids}}, [tokens_of(g, m.native) for _, g in items]
    sub = model.modality_submodules[name]
    vit = sub.encoders["vit"]
    if m.anyres_grid_pinpoints:
        images = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
        return ({"vit": tiled_inputs(images, sub.grid_pinpoints, m.vit.image)},
                [sub.rows_of(x.shape[:2]) for x in images])
    size = m.vit.image
    pixels = [image_tensor_values(np.asarray(Image.open(p).convert("RGB").resize((size, size), Image.BICUBIC)))
              for p in paths]
    return {"vit": {"pixel_values": torch.from_numpy(np.stack(pixels))}}, [vit.tokens_per_image] * len(paths)


def prompt_positions(cfg: Config, ids: torch.Tensor, mask: torch.Tensor, inputs: dict) -> torch.Tensor | None:
    """M-RoPE's `[B, S, 3]` positions of a left-padded prompt batch `ids` (`mask` 1 at tokens) whose images fill
    the native_vision modality's placeholders (mimo.models.mrope); None for a run without one, whose positions
    count from each row's first token."""
    native = [n for n, m in cfg.model.modalities.items() if m.kind == "native_vision"]
    if not native or not cfg.model.llm.mrope_section:
        return None
    m = cfg.model.modalities[native[0]]
    grids = inputs[native[0]]["visual"]["grid_thw"] if native[0] in inputs else torch.zeros(0, 3, dtype=torch.long)
    return mrope_positions(ids, m.token_id, grids, m.native.merge, attention_mask=mask)


def prompt_batch(cfg: Config, model: MimoModel, requests: list[PromptRequest], run: str,
                 encode: Any, bos: int | None) -> tuple[list[list[int]], dict, list[str]]:
    """(each prompt's ids, modality_inputs with one row per image and clip given in prompt order, warnings
    for clips longer than the run hears)."""
    placeholders: list[list[int]] = [[] for _ in requests]
    notes: list[str] = []
    inputs: dict = {}
    if any(r.image for r in requests):
        name = only_modality(cfg, VISION_KINDS, "--image", run)
        inputs[name], counts = image_inputs(cfg, model, name, [r.image for r in requests if r.image])
        it = iter(counts)
        for ids, r in zip(placeholders, requests):
            ids += [cfg.model.modalities[name].token_id] * next(it) if r.image else []
    if any(r.audio for r in requests):
        name = only_modality(cfg, ("audio",), "--audio", run)
        mcfg, encoder = cfg.model.modalities[name], model.modality_submodules[name].encoders["whisper"]
        length = clip_length(cfg, encoder)
        try:
            clips = [decode_audio(r.audio) for r in requests if r.audio]
        except AudioDecodeError as e:
            raise ConfigError(f"--audio: {e}") from e
        notes += [f"mimo: warning: --audio '{r.audio}' is {c.shape[0] / WHISPER_SAMPLING_RATE:.2f} s; this run "
                  f"hears the first {length / WHISPER_SAMPLING_RATE:.2f} s of a clip"
                  for r, c in zip([r for r in requests if r.audio], clips) if c.shape[0] > length]
        features, frames = log_mel_spectrogram(clips, n_mels=mcfg.audio.n_mels, num_samples=length)
        # The audio demo keeps each clip's own rows; real data's clips fill all of theirs (data/media.py).
        rows = [AudioEncoder.output_frames(int(f) if cfg.data.name == "avlm" else length // WHISPER_HOP)
                for f in frames]
        inputs[name] = {"whisper": {"input_features": features, OUTPUT_LENGTHS: torch.tensor(rows)}}
        it = iter(rows)
        for ids, r in zip(placeholders, requests):
            ids += [mcfg.token_id] * next(it) if r.audio else []
    start = [bos] if bos is not None else []
    return [start + p + encode(r.text) for p, r in zip(placeholders, requests)], inputs, notes
