"""Audio clips of different lengths: each gets its own number of placeholder tokens, and its encoder rows
land at exactly those placeholders, whatever else the batch holds."""

import numpy as np
import pytest
import torch

from mimo.config.schema import AudioConfig, ModalityConfig, ModelConfig
from mimo.data.audio_demo import CLIP_SAMPLES, audio_tokens, synth_tones
from mimo.models.audio_features import log_mel_spectrogram
from mimo.models.build import build_model
from tests.support.configs import tiny_llm

pytestmark = pytest.mark.usefixtures("one_thread")

AUD, MELS, FRAMES = 60, 8, 20


def tiny_audio_model():
    torch.manual_seed(0)
    cfg = ModelConfig(llm=tiny_llm(hidden=16, layers=1, heads=2, kv_heads=1, mlp=32),
                      modalities={"audio": ModalityConfig(kind="audio", token_id=AUD, audio=AudioConfig(
                          n_mels=MELS, hidden=8, layers=1, heads=2, mlp=16, max_positions=16))})
    return build_model(cfg)


def ids_with(counts: list[int], seq: int = 16) -> torch.Tensor:
    ids = torch.arange(1, seq + 1).repeat(len(counts), 1)
    for i, k in enumerate(counts):
        ids[i, 2 : 2 + k] = AUD
    return ids


def test_durations_give_their_own_token_counts():
    rng = np.random.default_rng(0)
    clips = [synth_tones("low", 1, "rising", rng), synth_tones("high", 3, "falling", rng)]
    assert clips[0].shape[0] < clips[1].shape[0] <= CLIP_SAMPLES
    tokens = [audio_tokens(c.shape[0]) for c in clips]
    assert tokens[0] < tokens[1] <= audio_tokens(CLIP_SAMPLES)
    feats, frames = log_mel_spectrogram(clips, n_mels=40, num_samples=CLIP_SAMPLES)
    assert feats.shape == (2, 40, CLIP_SAMPLES // 160)
    assert [(int(f) + 1) // 2 for f in frames] == tokens


def test_variable_length_rows_land_at_their_placeholders():
    model = tiny_audio_model()
    feats = torch.randn(3, MELS, FRAMES)
    lengths = torch.tensor([3, 7, 10])
    ids = ids_with([3, 7, 10])
    inputs = {"audio": {"whisper": {"input_features": feats, "output_lengths": lengths}}}
    embeds = model.combined_embeddings(ids, inputs)
    sub = model.modality_submodules["audio"]
    frames = sub.input_projections[0](sub.encoders["whisper"](feats))  # [3, 10, 16]
    for i, k in enumerate(lengths.tolist()):
        torch.testing.assert_close(embeds[i, 2 : 2 + k], frames[i, :k])
        torch.testing.assert_close(embeds[i, 2 + k :], model.language_model.embed(ids[i, 2 + k :]))


def test_splitting_clips_across_microbatches_gives_the_same_rows():
    model = tiny_audio_model()
    feats = torch.randn(4, MELS, FRAMES)
    lengths = torch.tensor([2, 9, 5, 10])
    whole = model.modality_submodules["audio"]({"whisper": {"input_features": feats, "output_lengths": lengths}})
    parts = [model.modality_submodules["audio"]({"whisper": {"input_features": feats[i : i + 1],
                                                             "output_lengths": lengths[i : i + 1]}})
             for i in range(4)]
    assert whole.shape == (26, 16)
    torch.testing.assert_close(torch.cat(parts), whole)


def test_mismatches_are_clear_errors():
    model = tiny_audio_model()
    feats = torch.randn(2, MELS, FRAMES)
    inputs = {"audio": {"whisper": {"input_features": feats, "output_lengths": torch.tensor([3, 4])}}}
    with pytest.raises(ValueError, match=r"Number of audio tokens \(8\) does not match number of audio embeddings "
                                         r"\(7\)"):
        model.combined_embeddings(ids_with([3, 5]), inputs)
    too_long = {"audio": {"whisper": {"input_features": feats, "output_lengths": torch.tensor([3, 11])}}}
    with pytest.raises(ValueError, match="needs 11 rows but only 10"):
        model.combined_embeddings(ids_with([3, 11]), too_long)


def test_no_clip_in_a_microbatch_runs_a_stand_in_with_zero_gradient():
    model = tiny_audio_model()
    ids = ids_with([0, 0])
    empty = {"audio": {"whisper": {"input_features": torch.zeros(0, MELS, FRAMES),
                                   "output_lengths": torch.zeros(0, dtype=torch.long)}}}
    out = model(ids, labels=ids, modality_inputs=empty)
    plain = model(ids, labels=ids)
    torch.testing.assert_close(out.loss_sum, plain.loss_sum)
    out.loss_sum.backward()
    grads = [p.grad for p in model.modality_submodules["audio"].parameters() if p.requires_grad]
    assert grads and all(g is not None and not g.any() for g in grads)
