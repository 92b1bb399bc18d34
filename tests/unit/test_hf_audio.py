"""Whisper: the torch log-mel front end equals WhisperFeatureExtractor, and the imported encoder gives
transformers' hidden states; shorter inputs (per-batch lengths) run without padding to 30 s."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mimo.config.schema import AudioConfig
from mimo.models.audio import AudioEncoder, sinusoids
from mimo.models.audio_features import log_mel_spectrogram
from tests.support.hf_helpers import TOL, rel_diff, transformers, whisper

pytestmark = pytest.mark.usefixtures("one_thread")

SR = 16000


def tones() -> list[np.ndarray]:
    """Two synthetic clips of different lengths: 440 Hz + 3 kHz for 0.7 s, 1234 Hz for 0.45 s."""
    t = np.arange(int(0.7 * SR)) / SR
    a = 0.5 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3000 * t)
    b = 0.3 * np.sin(2 * np.pi * 1234 * t[: int(0.45 * SR)])
    return [a.astype(np.float32), b.astype(np.float32)]


@pytest.mark.parametrize("padding", ["max_length", "longest"])
def test_log_mel_matches_whisper_feature_extractor(padding):
    fe = transformers.WhisperFeatureExtractor(feature_size=80, chunk_length=1)
    ref = fe(tones(), sampling_rate=SR, return_tensors="pt", padding=padding, return_attention_mask=True)
    ours, frames = log_mel_spectrogram(tones(), num_samples=SR if padding == "max_length" else None)
    assert ours.shape == ref["input_features"].shape
    assert (ours - ref["input_features"]).abs().max() <= 1e-4
    assert frames.tolist() == ref["attention_mask"].sum(1).tolist() == [70, 45]


def test_encoder_matches_transformers(tmp_path):
    hf, enc = whisper(tmp_path, max_positions=35)
    feats, _ = log_mel_spectrogram(tones(), num_samples=70 * 160)
    with torch.no_grad():
        ref = hf.encoder(feats, output_hidden_states=True)
        ours = enc(feats)
        # Block inputs/outputs: transformers' hidden_states ends with the final-norm output instead.
        x = F.gelu(enc.conv2(F.gelu(enc.conv1(feats)))).transpose(1, 2) + enc.embed_positions.weight[:35]
        layers = [x]
        for block in list(enc.layers.values())[:-1]:
            layers.append(x := block(x))
    assert ours.shape == (2, 35, 32)
    diffs = [rel_diff(a, b) for a, b in zip(layers, ref.hidden_states)] + [rel_diff(ours, ref.last_hidden_state)]
    assert len(diffs) == len(ref.hidden_states) and max(diffs) <= TOL, diffs


def test_shorter_inputs_use_the_leading_positions(tmp_path):
    _, enc = whisper(tmp_path)
    assert AudioEncoder.output_frames(13) == 7
    # Without blocks the encoder is local (conv stem + positions + norm): an input cut to 14 frames must
    # give the same first 6 rows as the full 20 frames, so the position table is sliced from its start.
    enc.layers.clear()
    feats = torch.randn(1, 80, 20)
    with torch.no_grad():
        full, short = enc(feats), enc(feats[..., :14])
    assert full.shape[1] == 10 and short.shape[1] == 7
    assert torch.allclose(short[:, :6], full[:, :6], atol=1e-6)


def test_sinusoidal_positions_are_whisper_and_frozen():
    enc = AudioEncoder(AudioConfig(hidden=16, max_positions=12))
    assert torch.equal(enc.embed_positions.weight, sinusoids(12, 16))
    assert not enc.embed_positions.weight.requires_grad
    assert AudioEncoder(AudioConfig(hidden=16, learned_positions=True)).embed_positions.weight.requires_grad


def test_too_many_frames_is_refused(tmp_path):
    _, enc = whisper(tmp_path)
    with pytest.raises(ValueError, match="more than the 20"):
        enc(torch.randn(1, 80, 24))
