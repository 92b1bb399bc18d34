"""Image + audio samples on disk (a JSONL manifest and a tar shard) and the tiny audio run that trains on them."""

from __future__ import annotations

import io
import json
import tarfile
import wave

import numpy as np
import pytest
from PIL import Image

from mimo.config.load import load_config
from mimo.data.audio_demo import synth_tones
from mimo.data.shapes import make_samples
from tests.support.configs import AVLM, TINY_AVLM

N = 8
AUDIO_S = 0.32  # 32 frames -> 16 placeholders
TINY_AUDIO = ["--model.modalities.audio.audio.max_positions=16", f"--data.audio_seconds={AUDIO_S}"]


def clip(i: int) -> np.ndarray:
    return synth_tones(("low", "high")[i % 2], 1 + i % 3, "rising", np.random.default_rng(i))[:4800]


def write_wav(path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def audio_config(out_dir, modalities: str, *extra: str):
    """The audio demo's tiny model, with its vision modality dropped for audio-only data; rows hold a chat in
    LLaVA-1.5's format (data.prompt_format = "chat")."""
    over = [*TINY_AVLM, *TINY_AUDIO, "--data.name=jsonl", "--data.seq_len=80", "--data.global_batch=4",
            "--train.steps=3", "--train.log_every=1", "--run.name=tiny", f"--run.out_dir={out_dir}", *extra]
    cfg = load_config(AVLM, over)
    if modalities == "audio":
        del cfg.model.modalities["images"]
    return cfg


def write_image_audio(root) -> None:
    """The same N image + clip + question samples as a JSONL manifest and as one tar shard."""
    (root / "media").mkdir()
    lines = []
    with tarfile.open(root / "shard.tar", "w") as tar:
        for i, s in enumerate(make_samples(N, 5)):
            Image.fromarray(s.images[0]).save(root / "media" / f"{i}.png")
            write_wav(root / "media" / f"{i}.wav", clip(i))
            meta = {"conversations": [{"from": "human", "value": f"<image>\n<audio>\n{s.question}"},
                                      {"from": "gpt", "value": s.answer}]}
            lines.append({"image": f"media/{i}.png", "audio": f"media/{i}.wav", **meta})
            for name, data in ((f"s{i}.png", (root / "media" / f"{i}.png").read_bytes()),
                               (f"s{i}.wav", (root / "media" / f"{i}.wav").read_bytes()),
                               (f"s{i}.json", json.dumps(meta).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def write_librispeech(root):
    """root/LibriSpeech/dev/<spk>/<chap>/<spk>-<chap>-<utt>.flac + the chapter's .trans.txt."""
    soundfile = pytest.importorskip("soundfile", reason="FLAC needs the audio extra: pip install -e '.[audio]'")
    chapter = root / "LibriSpeech" / "dev" / "84" / "121"
    chapter.mkdir(parents=True)
    lines = []
    for i in range(N):
        soundfile.write(chapter / f"84-121-{i:04d}.flac", clip(i), 16000)
        lines.append(f"84-121-{i:04d} {'HIGH' if i % 2 else 'LOW'} {i % 3 + 1}")
    (chapter / "84-121.trans.txt").write_text("\n".join(lines) + "\n")
    return root / "LibriSpeech" / "dev"
