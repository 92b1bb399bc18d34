"""Audio and image + audio samples in the JSONL and WebDataset readers, and the LibriSpeech recipe. Oracles:
log_mel_spectrogram of the waveform the test wrote (before encoding), hand-laid ids, and the same samples
in the two formats training to the same losses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mimo.config.schema import ConfigError
from mimo.data.librispeech import main as librispeech_main
from mimo.data.tokenizer import ByteTokenizer
from mimo.models.audio_features import log_mel_spectrogram
from mimo.models.loss import IGNORE_INDEX
from mimo.train.trainer import Trainer
from tests.support.audio_data import AUDIO_S, audio_config, clip, write_image_audio, write_librispeech, write_wav
from tests.support.tiny_run import metrics


def test_librispeech_manifest_and_the_batch_it_gives(tmp_path):
    split = write_librispeech(tmp_path)
    librispeech_main([str(split), str(tmp_path / "train.jsonl"), "--lowercase"])
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert rows[3] == {"audio": "LibriSpeech/dev/84/121/84-121-0003.flac", "text": "high 1"}
    tr = Trainer(audio_config(tmp_path, "audio", f"--data.path={tmp_path / 'train.jsonl'}"))
    batch = tr.data.global_batch(0, 4, tr.cfg.data.seed)
    index = tr.data.global_batch_indices(0, 4, tr.cfg.data.seed)[0]
    tok = ByteTokenizer()
    text = rows[index]["text"]
    want = [tok.BOS] + [260] * 16 + tok.encode(text) + [tok.EOS]
    assert batch["input_ids"][0, : len(want)].tolist() == want
    assert batch["labels"][0, 16 : 16 + len(text) + 1].tolist() == want[17:]
    assert (batch["labels"][0, :16] == IGNORE_INDEX).all()
    features = batch["modality_inputs"]["audio"]["whisper"]["input_features"][0]
    reference, _ = log_mel_spectrogram([clip(index)], n_mels=16, num_samples=int(AUDIO_S * 16000))
    assert features.shape == (16, 32) and torch.allclose(features, reference[0], atol=2e-3)


def test_image_and_audio_samples_train_alike_from_jsonl_and_webdataset(tmp_path):
    write_image_audio(tmp_path)
    Trainer(audio_config(tmp_path / "a", "both", f"--data.path={tmp_path / 'train.jsonl'}")).train()
    Trainer(audio_config(tmp_path / "b", "both", "--data.name=webdataset",
                         f"--data.path={tmp_path / 'shard.tar'}")).train()
    losses = [[r["loss"] for r in metrics(tmp_path / d) if "loss" in r] for d in "ab"]
    assert len(losses[0]) == 3 and all(np.isfinite(losses[0])) and losses[0] == losses[1]
    summary = json.loads((tmp_path / "a" / "tiny" / "summary.json").read_text())
    assert summary["eval"]["data"]["skipped_rows"] == 0


def test_a_sample_without_its_clip_is_skipped_and_bad_lengths_refused(tmp_path, capsys):
    write_image_audio(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if k != "audio"} if i == 2 else r for i, r in enumerate(rows)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tr = Trainer(audio_config(tmp_path, "both", f"--data.path={tmp_path / 'train.jsonl'}", "--train.steps=2"))
    tr.train()
    assert "': no audio" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="data.audio_seconds = 2.0 gives clips of 200 frames, more than the 32"):
        Trainer(audio_config(tmp_path, "audio", f"--data.path={tmp_path / 'train.jsonl'}", "--data.audio_seconds=2"))
    with pytest.raises(ConfigError, match=r"data.seq_len \(16\) must exceed the 16 placeholders"):
        Trainer(audio_config(tmp_path, "audio", f"--data.path={tmp_path / 'train.jsonl'}", "--data.seq_len=16"))


def test_without_soundfile_pcm_wav_still_decodes(tmp_path, monkeypatch):
    import mimo.data.audio_files as audio_files

    write_wav(tmp_path / "a.wav", clip(1))
    with_soundfile = audio_files.decode_audio(tmp_path / "a.wav")
    monkeypatch.setattr(audio_files, "soundfile_module", lambda: None)
    assert np.array_equal(audio_files.decode_audio(tmp_path / "a.wav"), with_soundfile)
    (tmp_path / "a.flac").write_bytes(b"fLaC\0\0\0")
    with pytest.raises(audio_files.AudioDecodeError, match=r"without soundfile only PCM \.wav is read"):
        audio_files.decode_audio(tmp_path / "a.flac")
