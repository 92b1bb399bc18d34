"""`mimo generate`'s text answers: prompts, each a text with its images and an optional clip, read from flags or a
file, laid out as training laid out its samples (the run's prompt format, mimo.data.chat: the images' and clip's
placeholders, then the question; a native-resolution image with its own grid's placeholders, between its vision
start and end tokens if the run has them, and M-RoPE positions), checked for a question about an input it was not
given, decoded greedily and written one line per prompt. A text with `<image>` markers takes its images there
instead, in order, one image per marker; an anyres OneVision run then gives each image of a several-image prompt
its own treatment (mimo.models.anyres.tiled_images)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from mimo.config.schema import Config, ConfigError, ModalityConfig
from mimo.data.anyres_tiles import tiled_inputs
from mimo.data.audio_demo import AUDIO_QUESTIONS, CLIP_SAMPLES
from mimo.data.audio_files import AudioDecodeError, decode_audio
from mimo.data.chat import DEMO, question_ids, special_ids
from mimo.data.image_text import IMAGE_TEXT_SETS
from mimo.data.media import clip_samples
from mimo.data.native_images import item_ids, load_item, tokens_of
from mimo.data.samples import BadSample, ImageRef
from mimo.data.shapes import QUESTIONS, image_tensor_values
from mimo.data.tokenizer import ByteTokenizer, load_tokenizer, run_tokenizer_spec, with_extra_tokens
from mimo.models.anyres import tiled_images
from mimo.models.audio import AudioEncoder
from mimo.models.audio_features import WHISPER_HOP, WHISPER_SAMPLING_RATE, log_mel_spectrogram
from mimo.models.generate import greedy_generate, left_pad
from mimo.models.mrope import mrope_positions
from mimo.models.multimodal import MimoModel
from mimo.models.sample_rows import OUTPUT_LENGTHS

IMAGE_MARK, AUDIO_MARK = "<image>", "<audio>"
VISION_KINDS = ("vision", "native_vision")
ALWAYS_IMAGE_SETS = ("shapes", *IMAGE_TEXT_SETS)
"""Data sets whose every training sample holds an image: a prompt without one is unlike all of them."""


@dataclass(frozen=True)
class PromptRequest:
    """A prompt: its text, its images (before the text, or one at each `<image>` marker of it) and clip."""

    text: str
    images: tuple[str, ...] = ()
    audio: str | None = None


def pair_inputs(texts: list[str], images: list[str], clips: list[str]) -> list[PromptRequest]:
    """One request per text; `images` and `clips` give one per text or one for all (or none). When the texts
    hold `<image>` markers and images are given, the images fill the markers in prompt order instead."""
    marks = [t.count(IMAGE_MARK) for t in texts]
    if images and any(marks):
        if sum(marks) != len(images):
            raise ConfigError(f"the prompts hold {sum(marks)} {IMAGE_MARK} marker(s) but {len(images)} --image "
                              f"flag(s) were given; give one --image per {IMAGE_MARK}, in prompt order")
        ends = np.cumsum([0, *marks]).tolist()
        per_text = [tuple(images[a:b]) for a, b in zip(ends, ends[1:])]
    else:
        per_text = [(x,) if x else () for x in picked(images, len(texts), "--image")]
    clip = picked(clips, len(texts), "--audio")
    return [PromptRequest(t, ims, c) for t, ims, c in zip(texts, per_text, clip)]


def picked(given: list[str], n: int, flag: str) -> list[str | None]:
    """One of `given` for each of `n` prompts: one each, or one for all (none: None)."""
    if given and len(given) not in (1, n):
        raise ConfigError(f"give one {flag} for every prompt, or one for all; got {len(given)} for {n} prompts")
    return [(given[i] if len(given) > 1 else given[0]) if given else None for i in range(n)]


def check_markers(request: PromptRequest) -> None:
    """Refuses a prompt whose images cannot be placed: several images need one `<image>` marker each, and a text
    with markers needs as many images."""
    marks = request.text.count(IMAGE_MARK)
    if (marks or len(request.images) > 1) and marks != len(request.images):
        raise ConfigError(f"the prompt {request.text!r} holds {marks} {IMAGE_MARK} marker(s) for "
                          f"{len(request.images)} image(s); write one {IMAGE_MARK} where each image goes")


def read_prompt_file(path: str | Path) -> tuple[list[str], list[PromptRequest]]:
    """`--prompts FILE`: (texts, []) for a text file of one prompt per non-empty line, or ([], requests) for a
    .jsonl file of {"prompt": ..., "image": ..., "audio": ...} objects (paths relative to the file; "image" a path
    or a list of them, one per `<image>` marker)."""
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
        image = row.get("image") or []
        image = [image] if isinstance(image, str) else image
        if not isinstance(image, list) or not all(isinstance(x, str) and x for x in image):
            raise ConfigError(f"--prompts '{p}' line {number}: \"image\" is a path or a list of paths (one per "
                              f"<image> marker), e.g. \"image\": [\"a.png\", \"b.png\"]; got {row['image']!r}")
        images = tuple(str(p.parent / x) for x in image)
        audio = str(p.parent / row["audio"]) if row.get("audio") else None
        requests.append(PromptRequest(row["prompt"], images, audio))
    return [], requests


def check_out_request(requests: list[PromptRequest], max_new_tokens: int | None) -> None:
    """Refuses what `mimo generate --out` would drop: the Out path draws one text prompt in a single forward (no
    image or clip is read, no tokens are decoded), so an image, a clip, several prompts or --max-new-tokens
    would be silently ignored."""
    if max_new_tokens is not None:
        raise ConfigError("--max-new-tokens sets the length of a text answer; --out draws an image in one pass "
                          "and decodes no tokens: drop --max-new-tokens, or drop --out for a text answer")
    if len(requests) != 1:
        raise ConfigError(f"--out draws one prompt; got {len(requests)} prompts: give one --prompt")
    r = requests[0]
    if r.images or r.audio:
        flag = "--image" if r.images else "--audio"
        raise ConfigError(f"--out draws from the prompt's text alone and reads no image or sound; drop {flag} "
                          "(or the JSONL line's \"image\"/\"audio\"), or drop --out to ask about it in text")


def missing_input_warnings(cfg: Config, requests: list[PromptRequest]) -> list[str]:
    """A `mimo: warning:` line for each prompt that asks about an image or a sound it was not given: a demo
    question about one, a literal <image> / <audio>, or a data set whose every sample held one (real data
    holds every input the model takes; the shapes demo always an image)."""
    kinds = {m.kind for m in cfg.model.modalities.values()}
    out = []
    for r in requests:
        if kinds & set(VISION_KINDS) and not r.images and (
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


def image_inputs(cfg: Config, model: MimoModel, name: str, paths: list[str],
                 per_prompt: list[int]) -> tuple[dict, list[int]]:
    """(modality `name`'s encoder inputs for the images at `paths`, each image's placeholders), as training reads
    them: a fixed-size ViT's square bicubic resize, an anyres modality's tiles of the image at its own size
    (mimo.data.anyres_tiles; OneVision's several-image prompts, of `per_prompt` images each in order, a square
    tile per image: mimo.models.anyres.tiled_images), or a native-resolution tower's own grid within its
    [min_pixels, max_pixels] (mimo.data.native_images)."""
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
        tiled = tiled_images(sub.max_tiles, per_prompt)
        return ({"vit": tiled_inputs(images, sub.grid_pinpoints, m.vit.image, tiled if sub.max_tiles else None)},
                [sub.rows_of(x.shape[:2], t) for x, t in zip(images, tiled)])
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
                 tok: Any) -> tuple[list[list[int]], dict, list[str]]:
    """(each prompt's ids in the run's prompt format (`run_prompt_format`, mimo.data.chat.question_ids),
    modality_inputs with one row per image and clip given in prompt order, warnings for clips longer than the
    run hears). Refuses a prompt whose `<image>` markers and images differ in count."""
    for r in requests:
        check_markers(r)
    per_image: list[list[list[int]]] = [[] for _ in requests]  # each prompt's images' ids
    clip_ids: list[list[int]] = [[] for _ in requests]
    notes: list[str] = []
    inputs: dict = {}
    if any(r.images for r in requests):
        name = only_modality(cfg, VISION_KINDS, "--image", run)
        inputs[name], counts = image_inputs(cfg, model, name, [x for r in requests for x in r.images],
                                            [len(r.images) for r in requests if r.images])
        it = iter(counts)
        per_image = [[image_ids(cfg.model.modalities[name], next(it)) for _ in r.images] for r in requests]
    if any(r.audio for r in requests):
        name = only_modality(cfg, ("audio",), "--audio", run)
        inputs[name], rows, notes = clip_inputs(cfg, model, name, [r.audio for r in requests if r.audio])
        it = iter(rows)
        clip_ids = [[cfg.model.modalities[name].token_id] * next(it) if r.audio else [] for r in requests]
    fmt = run_prompt_format(cfg)
    return [question_ids(tok, fmt, r.text, n, c) for r, n, c in zip(requests, per_image, clip_ids)], inputs, notes


def run_prompt_format(cfg: Config) -> str:
    """The layout a run's prompts take: data.prompt_format on real data, the demo sets' own layout otherwise."""
    return cfg.data.prompt_format if cfg.data.name in IMAGE_TEXT_SETS else DEMO


def image_ids(m: ModalityConfig, rows: int) -> list[int]:
    """One image's ids in a prompt: its `rows` placeholders (a native-resolution one's between its vision start and
    end tokens, if any, as in training)."""
    return item_ids(rows, m.token_id, m.native) if m.kind == "native_vision" else [m.token_id] * rows


def generate_text(cfg: Config, model: MimoModel, requests: list[PromptRequest], max_new_tokens: int,
                  run: str) -> list[str]:
    """`mimo generate`: each prompt (after its image and clip, if any) decoded greedily, all in one left-padded
    batch (M-RoPE positions for a native-resolution run). The run's tokenizer (the one `mimo export` ships)
    encodes it in the run's prompt format (`prompt_batch`); decoding drops EOS, special tokens and placeholders.
    A prompt that asks about an input it lacks gets a warning on stderr first."""
    spec = run_tokenizer_spec(cfg.data.tokenizer, cfg.model.llm.hf_path)
    tok = (ByteTokenizer() if spec == "byte"
           else with_extra_tokens(load_tokenizer(spec), cfg.model.llm.extra_token_ids, f"tokenizer '{spec}'"))
    _, eos, pad = special_ids(tok)
    prompts, modality_inputs, notes = prompt_batch(cfg, model, requests, run, tok)
    for line in [*missing_input_warnings(cfg, requests), *notes]:
        print(line, file=sys.stderr)
    ids, mask = left_pad(prompts, pad)
    outs = greedy_generate(model, ids, modality_inputs or None, max_new_tokens, eos, attention_mask=mask,
                           position_ids=prompt_positions(cfg, ids, mask, modality_inputs))
    if spec == "byte":
        return [tok.decode(o) for o in outs]
    # Placeholders are special tokens in the exported tokenizer, so `batch_decode` there skips them too.
    drop = {eos, *model.special_token_ids.values()}
    return [tok.decode([i for i in o if i not in drop], skip_special_tokens=True) for o in outs]


def answer_lines(requests: list[PromptRequest], answers: list[str], jsonl: bool) -> list[str]:
    """One line per prompt: the answer with a backslash written `\\\\` and a newline `\\n` (a carriage return
    `\\r`), or with `jsonl` a JSON object of the prompt, its images and clip, and the answer."""
    if jsonl:
        return [json.dumps({"prompt": r.text, "image": list(r.images), "audio": r.audio, "answer": a})
                for r, a in zip(requests, answers)]
    return [a.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r") for a in answers]


def clip_inputs(cfg: Config, model: MimoModel, name: str, paths: list[str]) -> tuple[dict, list[int], list[str]]:
    """(audio modality `name`'s encoder inputs for the clips at `paths`, each clip's placeholders, warnings for
    clips longer than the run hears)."""
    mcfg, encoder = cfg.model.modalities[name], model.modality_submodules[name].encoders["whisper"]
    length = clip_length(cfg, encoder)
    try:
        clips = [decode_audio(p) for p in paths]
    except AudioDecodeError as e:
        raise ConfigError(f"--audio: {e}") from e
    notes = [f"mimo: warning: --audio '{p}' is {c.shape[0] / WHISPER_SAMPLING_RATE:.2f} s; this run hears the "
             f"first {length / WHISPER_SAMPLING_RATE:.2f} s of a clip"
             for p, c in zip(paths, clips) if c.shape[0] > length]
    features, frames = log_mel_spectrogram(clips, n_mels=mcfg.audio.n_mels, num_samples=length)
    # The audio demo keeps each clip's own rows; real data's clips fill all of theirs (data/media.py).
    rows = [AudioEncoder.output_frames(int(f) if cfg.data.name == "avlm" else length // WHISPER_HOP) for f in frames]
    return {"whisper": {"input_features": features, OUTPUT_LENGTHS: torch.tensor(rows)}}, rows, notes
