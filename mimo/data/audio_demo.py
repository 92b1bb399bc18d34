"""The audio-visual demo: questions about a rendered image (the shapes task) and about a tone sequence.

Audio is synthesised at run time (nothing is downloaded): one to three beeps, all low or all high,
each gliding up or down. A sample holds an image, a clip or both, and asks about one of them:
*what color? / what shape? / how many?* about the image, *high or low? / number of beeps? / rising
or falling?* about the clip. Layouts cycle (image only, audio only, both with an image question,
both with an audio question, ...; see LAYOUTS), so a batch always mixes samples with and without
each modality.

A sequence is `<bos> [<image>*16] [<audio>*k] question answer <eos> <pad>...`, where k depends on
the clip's duration (one token per two log-mel frames of audio). Clips are padded to one fixed
length, CLIP_SECONDS, before the encoder (as Whisper pads to 30 s), and `output_lengths` keeps each
clip's own k rows. Modality inputs are flat (one row per image or clip) with `modality_counts`
saying how many each sample holds, so batches split by samples on any layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mimo.config.schema import Config
from mimo.data.demo import question_answer_rows
from mimo.data.seeded_batches import SeededBatches
from mimo.data.shapes import COLORS, COUNTS, IMAGE_SIZE, QUESTIONS, SHAPES, image_tensor_values, render
from mimo.data.tokenizer import ByteTokenizer
from mimo.models.audio import AudioEncoder
from mimo.models.audio_features import WHISPER_SAMPLING_RATE, audio_frames, log_mel_spectrogram
from mimo.models.multimodal import MimoModel
from mimo.models.sample_rows import OUTPUT_LENGTHS

CLIP_SECONDS = 0.6
CLIP_SAMPLES = int(CLIP_SECONDS * WHISPER_SAMPLING_RATE)
PITCHES = {"low": (300.0, 450.0), "high": (2000.0, 3000.0)}  # start frequency ranges; glides stay apart
DIRECTIONS = ("rising", "falling")
GLIDE = 2.0  # frequency ratio from a beep's start to its end
# Worded unlike the image questions from the first character on ("how many beeps?" next to "how many?" had a
# character-level LM count beeps for shapes), so the question alone says which modality to read.
AUDIO_QUESTIONS = {"pitch": "high or low?", "beeps": "number of beeps?", "direction": "rising or falling?"}
# (what a sample holds, what its question is about), cycled. Two in three questions are about the image: its
# shape question takes a tiny model far more examples than anything the clips ask.
LAYOUTS = ((("image",), "image"), (("audio",), "audio"), (("image", "audio"), "image"),
           (("image", "audio"), "audio"), (("image",), "image"), (("image", "audio"), "image"))


@dataclass
class AVSample:
    image: np.ndarray | None  # uint8 [H, W, 3]
    audio: np.ndarray | None  # float32 waveform at 16 kHz, at most CLIP_SAMPLES long
    question: str
    answer: str
    about: str  # "image" or "audio"


def synth_tones(pitch: str, beeps: int, direction: str, rng: np.random.Generator) -> np.ndarray:
    """`beeps` gliding sine beeps (10 ms fades) with silence around and between, plus faint noise."""
    sr = WHISPER_SAMPLING_RATE
    base = rng.uniform(*PITCHES[pitch])
    ratio = GLIDE if direction == "rising" else 1.0 / GLIDE
    parts = [np.zeros(int(rng.uniform(0.02, 0.05) * sr), np.float32)]
    for i in range(beeps):
        n = int(rng.uniform(0.08, 0.12) * sr)
        freq = base * ratio ** (np.arange(n) / n)
        fade = np.minimum(1.0, np.minimum(np.arange(n), np.arange(n)[::-1]) / (0.01 * sr))
        parts.append((rng.uniform(0.3, 0.6) * fade * np.sin(2 * np.pi * np.cumsum(freq) / sr)).astype(np.float32))
        if i < beeps - 1:
            parts.append(np.zeros(int(rng.uniform(0.04, 0.07) * sr), np.float32))
    parts.append(np.zeros(int(rng.uniform(0.02, 0.04) * sr), np.float32))
    wave = np.concatenate(parts)
    return (wave + 0.01 * rng.standard_normal(wave.shape[0])).astype(np.float32)


def audio_tokens(num_samples: int) -> int:
    """Placeholder tokens of a clip: its log-mel frames (within the padded clip) after the encoder's stride."""
    return AudioEncoder.output_frames(audio_frames(num_samples, CLIP_SAMPLES))


def make_av_sample(i: int, seed: int) -> AVSample:
    """Sample i of a set, drawn from its own seed; layouts and question kinds cycle with i so that every
    (layout, kind) pair is balanced."""
    rng = np.random.default_rng([seed, i])
    layout, about = LAYOUTS[i % len(LAYOUTS)]
    shape, color = SHAPES[rng.integers(len(SHAPES))], list(COLORS)[rng.integers(len(COLORS))]
    count = int(rng.integers(1, 4))
    pitch, direction = list(PITCHES)[rng.integers(2)], DIRECTIONS[rng.integers(2)]
    beeps = int(rng.integers(1, 4))
    image = render(shape, color, count, rng) if "image" in layout else None
    audio = synth_tones(pitch, beeps, direction, rng) if "audio" in layout else None
    kind_index = i // len(LAYOUTS)
    if about == "image":
        kind = list(QUESTIONS)[kind_index % len(QUESTIONS)]
        question, answer = QUESTIONS[kind], {"color": color, "shape": shape, "count": COUNTS[count - 1]}[kind]
    else:
        kind = list(AUDIO_QUESTIONS)[kind_index % len(AUDIO_QUESTIONS)]
        question = AUDIO_QUESTIONS[kind]
        answer = {"pitch": pitch, "beeps": COUNTS[beeps - 1], "direction": direction}[kind]
    return AVSample(image, audio, question, answer, about)


class AVSamples(Sequence[AVSample]):
    """`n` samples built on demand, nothing stored: a training set large enough that a run rarely sees a
    sample twice costs no memory (clips would take ~20 KB each)."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int | slice) -> AVSample | list[AVSample]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not 0 <= i < self.n:
            raise IndexError(f"sample {i} of a set of {self.n}")
        return make_av_sample(i, self.seed)


def avlm_row_length(image_tokens: int) -> int:
    """Tokens of every row of the audio-visual task (an image of `image_tokens` rows, the longest clip,
    question and answer), padded to a multiple of 8."""
    questions = [*QUESTIONS.values(), *AUDIO_QUESTIONS.values()]
    answers = [*COLORS, *SHAPES, *COUNTS, *PITCHES, *DIRECTIONS]
    longest = 1 + image_tokens + audio_tokens(CLIP_SAMPLES) + max(map(len, questions)) + max(map(len, answers)) + 1
    return -(-longest // 8) * 8


class AVLMData(SeededBatches):
    """Train and held-out sets of the audio-visual task, tokenised, with mixed-modality batches."""

    def __init__(self, train_samples: int, eval_samples: int, seed: int, image_tokens: int, image_token_id: int,
                 audio_token_id: int, n_mels: int, image_modality: str = "images", audio_modality: str = "audio"):
        self.tok = ByteTokenizer()
        self.image_tokens, self.image_token_id, self.audio_token_id = image_tokens, image_token_id, audio_token_id
        self.n_mels = n_mels
        self.image_modality, self.audio_modality = image_modality, audio_modality
        self.train = AVSamples(train_samples, seed)
        self.eval = list(AVSamples(eval_samples, seed + 1_000_003))
        self.seq_len = avlm_row_length(image_tokens)

    def prompt_ids(self, s: AVSample) -> list[int]:
        ids = [self.tok.BOS]
        if s.image is not None:
            ids += [self.image_token_id] * self.image_tokens
        if s.audio is not None:
            ids += [self.audio_token_id] * audio_tokens(s.audio.shape[0])
        return ids + self.tok.encode(s.question)

    def modality_inputs(self, samples: list[AVSample]) -> tuple[dict, dict]:
        """(modality_inputs, modality_counts): flat images and clips of these samples, and per-sample counts."""
        images = [image_tensor_values(s.image) for s in samples if s.image is not None]
        clips = [s.audio for s in samples if s.audio is not None]
        pixels = torch.from_numpy(np.stack(images)) if images else torch.zeros(0, 3, IMAGE_SIZE, IMAGE_SIZE)
        features, frames = log_mel_spectrogram(clips, n_mels=self.n_mels, num_samples=CLIP_SAMPLES)
        lengths = torch.tensor([AudioEncoder.output_frames(int(f)) for f in frames], dtype=torch.long)
        inputs = {self.image_modality: {"vit": {"pixel_values": pixels}},
                  self.audio_modality: {"whisper": {"input_features": features, OUTPUT_LENGTHS: lengths}}}
        counts = {self.image_modality: torch.tensor([int(s.image is not None) for s in samples]),
                  self.audio_modality: torch.tensor([int(s.audio is not None) for s in samples])}
        return inputs, counts

    def collate(self, samples: list[AVSample]) -> dict:
        """Samples -> the keyword arguments of MimoModel.forward, plus `modality_counts` for splitting."""
        b, s = len(samples), self.seq_len
        ids, labels = question_answer_rows([(self.prompt_ids(x), x.answer) for x in samples], s, self.tok)
        inputs, counts = self.modality_inputs(samples)
        return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(s).expand(b, s).contiguous(),
                "modality_inputs": inputs, "modality_counts": counts}


def build_avlm_data(cfg: Config, model: MimoModel) -> AVLMData:
    """The data set for `data.name = "avlm"`: one vision and one audio modality under model.modalities."""
    kinds = {m.kind: (n, m) for n, m in cfg.model.modalities.items()}
    if sorted(m.kind for m in cfg.model.modalities.values()) != ["audio", "vision"]:
        raise ValueError("data.name = 'avlm' needs exactly two modalities, one with kind = 'vision' and one with "
                         "kind = 'audio', under model.modalities")
    (img_name, img), (aud_name, aud) = kinds["vision"], kinds["audio"]
    vit = model.modality_submodules[img_name].encoders["vit"]
    return AVLMData(cfg.data.train_samples, cfg.data.eval_samples, cfg.data.seed, vit.tokens_per_image,
                    img.token_id, aud.token_id, aud.audio.n_mels, image_modality=img_name, audio_modality=aud_name)
