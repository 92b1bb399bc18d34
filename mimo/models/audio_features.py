"""Whisper's log-mel front end in torch: waveforms of any lengths -> `[B, n_mels, frames]` features.

Matches `transformers.WhisperFeatureExtractor` (Hann-window STFT, power spectrum, Slaney mel filters up to
8 kHz, log10, clamp to 8 below each sample's maximum, then (x + 4) / 4). Being plain torch, it runs on the
training device and inside a data loader without numpy round trips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

WHISPER_SAMPLING_RATE = 16000
WHISPER_N_FFT = 400
WHISPER_HOP = 160
WHISPER_SAMPLES = 30 * WHISPER_SAMPLING_RATE


def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above."""
    linear = 3.0 * hz / 200.0
    log = 15.0 + torch.log(hz.clamp_min(1e-10) / 1000.0) * (27.0 / math.log(6.4))
    return torch.where(hz >= 1000.0, log, linear)


def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    linear = 200.0 * mel / 3.0
    log = 1000.0 * torch.exp((mel - 15.0) * (math.log(6.4) / 27.0))
    return torch.where(mel >= 15.0, log, linear)


def mel_filterbank(n_mels: int, n_fft: int, sampling_rate: int, f_min: float = 0.0,
                   f_max: float = 8000.0) -> torch.Tensor:
    """Slaney-normalised triangular filters `[n_fft // 2 + 1, n_mels]` (computed in float64)."""
    edges = mel_to_hz(torch.linspace(float(hz_to_mel(torch.tensor(f_min, dtype=torch.float64))),
                                     float(hz_to_mel(torch.tensor(f_max, dtype=torch.float64))),
                                     n_mels + 2, dtype=torch.float64))
    bins = torch.linspace(0, sampling_rate // 2, n_fft // 2 + 1, dtype=torch.float64)
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (bins[:, None] - lower) / (center - lower)
    falling = (upper - bins[:, None]) / (upper - center)
    filters = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return (filters * (2.0 / (upper - lower))).float()


def _as_waveform(w: torch.Tensor | np.ndarray | Sequence[float], i: int) -> torch.Tensor:
    t = torch.as_tensor(w, dtype=torch.float32)
    if t.dim() != 1:
        raise ValueError(f"waveform {i} must be 1-D mono samples, got shape {tuple(t.shape)}; average the "
                         "channels first")
    return t


def audio_frames(num_samples: int, length: int, hop_length: int = WHISPER_HOP) -> int:
    """Feature frames that hold audio for a waveform of `num_samples` padded or cut to `length` samples."""
    return min(-(-min(num_samples, length) // hop_length), length // hop_length)


def log_mel_spectrogram(waveforms: Sequence[torch.Tensor | np.ndarray] | torch.Tensor, n_mels: int = 80,
                        sampling_rate: int = WHISPER_SAMPLING_RATE, n_fft: int = WHISPER_N_FFT,
                        hop_length: int = WHISPER_HOP, num_samples: int | None = WHISPER_SAMPLES,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Features `[B, n_mels, num_samples // hop_length]` and each sample's count of frames holding audio.

    Each waveform is zero-padded (or cut, as Whisper does) to `num_samples`; `num_samples=None` pads to the
    longest waveform instead, for an encoder that accepts shorter inputs. With `num_samples` set, no
    waveforms give `[0, n_mels, num_samples // hop_length]` (a batch without clips).
    """
    if isinstance(waveforms, torch.Tensor) and waveforms.dim() == 1:
        waveforms = [waveforms]
    waves = [_as_waveform(w, i) for i, w in enumerate(waveforms)]
    if not waves:
        if num_samples is None:
            raise ValueError("log_mel_spectrogram got no waveforms (and no num_samples to size an empty batch)")
        return torch.zeros(0, n_mels, num_samples // hop_length), torch.zeros(0, dtype=torch.long)
    length = num_samples if num_samples is not None else max(w.numel() for w in waves)
    device = waves[0].device
    batch = torch.zeros(len(waves), length, device=device)
    for i, w in enumerate(waves):
        n = min(w.numel(), length)
        batch[i, :n] = w[:n].to(device)
    spec = torch.stft(batch, n_fft, hop_length, window=torch.hann_window(n_fft, device=device), return_complex=True)
    power = spec[..., :-1].abs().pow(2)
    mel = mel_filterbank(n_mels, n_fft, sampling_rate).to(device).t() @ power
    log_spec = mel.clamp_min(1e-10).log10()
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    log_spec = torch.maximum(log_spec, peak - 8.0)
    frames = torch.tensor([audio_frames(w.numel(), length, hop_length) for w in waves])
    return (log_spec + 4.0) / 4.0, frames
