"""Image + audio samples on two data-parallel ranks: each rank decodes only its half of the global batch's
images and clips, and the losses are the single process's."""

from __future__ import annotations

from pathlib import Path

from mimo.train.trainer import Trainer
from tests.support.audio_data import audio_config, write_image_audio
from tests.support.dist import run_distributed


def _losses(rank: int, world: int, out: str, data: str) -> tuple[list[float], dict[str, int]]:
    tr = Trainer(audio_config(Path(out), "both", f"--data.path={data}"))
    losses = [tr.train_step(s)["loss"] for s in range(3)]
    return losses, {name: len(rows) for name, rows in tr.data.input_rows.items()}


def test_two_ranks_decode_their_share_of_images_and_clips(tmp_path):
    write_image_audio(tmp_path)
    data = str(tmp_path / "train.jsonl")
    one = Trainer(audio_config(tmp_path / "one", "both", f"--data.path={data}"))
    expected = [one.train_step(s)["loss"] for s in range(3)]
    for losses, rows in run_distributed(_losses, 2, str(tmp_path / "two"), data, timeout=240):
        assert rows == {"images": 2, "audio": 2}  # half of the global batch of 4
        assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(expected, losses)), (expected, losses)
