"""What a real-data sample's inputs are, per modality of the model: a vision modality takes the sample's
image, an audio modality its clip. Each has a fixed number of placeholders per sample (the ViT's patches; a
clip's frames after the encoder's stride, clips being padded or cut to one length as Whisper pads to 30 s),
so the text ranks lay out a row without decoding any input."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mimo.config.schema import Config
from mimo.data.audio_files import AudioDecodeError, decode_audio
from mimo.data.samples import BadSample, Record, decode_image
from mimo.models.audio import AudioEncoder
from mimo.models.audio_features import WHISPER_HOP, WHISPER_SAMPLING_RATE, log_mel_spectrogram
from mimo.models.multimodal import MimoModel
from mimo.models.sample_rows import OUTPUT_LENGTHS


@dataclass(frozen=True)
class MediaSpec:
    """One modality's input of every sample: `tokens` placeholders of `token_id`, fed to `encoder` as `key`."""

    name: str
    kind: str  # "vision" or "audio"
    token_id: int
    tokens: int
    image_size: int = 0  # vision: the side images are resized to
    n_mels: int = 0  # audio: mel bins
    clip_samples: int = 0  # audio: 16 kHz samples every clip is padded or cut to

    @property
    def encoder(self) -> str:
        return "vit" if self.kind == "vision" else "whisper"

    @property
    def key(self) -> str:
        return "pixel_values" if self.kind == "vision" else "input_features"

    def decode(self, rec: Record) -> np.ndarray:
        """The input of `rec`: float32 CHW pixels in [-1, 1], or log-mel features [n_mels, frames]. Raises
        BadSample when the sample lacks it or it does not decode."""
        if self.kind == "vision":
            if rec.image is None:
                raise BadSample("no image")
            return decode_image(rec.image.read(), self.image_size)
        if rec.audio is None:
            raise BadSample("no audio")
        try:
            wave = decode_audio(rec.audio.read(), rec.audio.path)
        except AudioDecodeError as e:
            raise BadSample(str(e)) from e
        features, _ = log_mel_spectrogram([wave], n_mels=self.n_mels, num_samples=self.clip_samples)
        return features[0].numpy()

    def empty(self, n: int) -> torch.Tensor:
        """`n` all-zero inputs (rows this rank does not decode, or skipped ones)."""
        if self.kind == "vision":
            return torch.zeros(n, 3, self.image_size, self.image_size)
        return torch.zeros(n, self.n_mels, self.clip_samples // WHISPER_HOP)

    def inputs(self, values: torch.Tensor) -> dict:
        """The encoder's keyword arguments for a batch of decoded inputs (a clip keeps all its rows)."""
        if self.kind == "vision":
            return {self.key: values}
        return {self.key: values, OUTPUT_LENGTHS: torch.full((values.shape[0],), self.tokens, dtype=torch.long)}


def clip_samples(cfg: Config, max_positions: int) -> int:
    """data.audio_seconds at 16 kHz, or (0) the longest clip an encoder of `max_positions` takes."""
    if cfg.data.audio_seconds > 0:
        return int(cfg.data.audio_seconds * WHISPER_SAMPLING_RATE)
    return 2 * max_positions * WHISPER_HOP


def media_specs(cfg: Config, model: MimoModel) -> list[MediaSpec]:
    """The model's vision modality and/or audio modality (at most one of each), in that order."""
    specs = []
    for name, m in sorted(cfg.model.modalities.items(), key=lambda kv: kv[1].kind != "vision"):
        if m.kind == "vision":
            tokens = model.modality_submodules[name].encoders["vit"].tokens_per_image
            specs.append(MediaSpec(name, "vision", m.token_id, tokens, image_size=m.vit.image))
        else:
            samples = clip_samples(cfg, m.audio.max_positions)
            tokens = AudioEncoder.output_frames(samples // WHISPER_HOP)
            specs.append(MediaSpec(name, "audio", m.token_id, tokens, n_mels=m.audio.n_mels, clip_samples=samples))
    return specs
