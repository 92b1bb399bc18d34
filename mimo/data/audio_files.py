"""Encoded audio (wav, flac, ogg, ... as a file or bytes) -> a mono float32 waveform at the audio encoder's
sampling rate (16 kHz), for `mimo generate --audio` and the readers of real audio data.

Decoding uses soundfile (libsndfile; `pip install -e '.[audio]'`) when it is installed, else the standard
library's `wave`, which reads PCM .wav only. Channels are averaged; another sampling rate is resampled by
linear interpolation (for speech, record or convert at 16 kHz to keep the whole band)."""

from __future__ import annotations

import importlib
import io
import wave
from pathlib import Path

import numpy as np

from mimo.models.audio_features import WHISPER_SAMPLING_RATE


class AudioDecodeError(ValueError):
    """A clip that could not be decoded (its name and why are in the message)."""


def soundfile_module():
    """The soundfile module, or None when it is not installed."""
    try:
        return importlib.import_module("soundfile")
    except ImportError:
        return None


def _read_wave(buffer: io.BytesIO) -> tuple[np.ndarray, int]:
    """(samples [n, channels] in [-1, 1], rate) of a PCM .wav with the standard library."""
    with wave.open(buffer) as w:
        width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
        raw = w.readframes(w.getnframes())
    if width == 1:
        ints = np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0
    elif width in (2, 4):
        ints = np.frombuffer(raw, np.int16 if width == 2 else np.int32).astype(np.float32)
    else:
        raise AudioDecodeError(f"{8 * width}-bit PCM; install soundfile (pip install -e '.[audio]') to read it")
    return ints.reshape(-1, channels) / float(2 ** (8 * width - 1)), rate


def resample(samples: np.ndarray, rate: int, target: int = WHISPER_SAMPLING_RATE) -> np.ndarray:
    """`samples` (1-D) from `rate` to `target` Hz by linear interpolation (unchanged when they are equal)."""
    if rate == target or samples.size == 0:
        return samples.astype(np.float32)
    n = max(1, round(samples.size * target / rate))
    return np.interp(np.arange(n) * (rate / target), np.arange(samples.size), samples).astype(np.float32)


def decode_audio(source: bytes | str | Path, name: str = "") -> np.ndarray:
    """Mono float32 samples at 16 kHz of an encoded clip (`source`: its bytes, or a file path). Raises
    AudioDecodeError naming `name` (or the path) and why when it cannot be read or holds no samples."""
    label = name or str(source if not isinstance(source, bytes) else "clip")
    try:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
    except OSError as e:
        raise AudioDecodeError(f"audio '{label}' is unreadable ({e.strerror or e})") from e
    sf = soundfile_module()
    try:
        if sf is not None:
            samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        else:
            samples, rate = _read_wave(io.BytesIO(data))
    except AudioDecodeError as e:
        raise AudioDecodeError(f"audio '{label}': {e}") from e
    except (RuntimeError, wave.Error, EOFError, ValueError) as e:  # libsndfile's errors are RuntimeErrors
        hint = "" if sf is not None else " (without soundfile only PCM .wav is read: pip install -e '.[audio]')"
        raise AudioDecodeError(f"audio '{label}' cannot be decoded ({type(e).__name__}: {e}){hint}") from e
    if samples.shape[0] == 0:
        raise AudioDecodeError(f"audio '{label}' holds no samples")
    return resample(samples.mean(axis=1), int(rate))
