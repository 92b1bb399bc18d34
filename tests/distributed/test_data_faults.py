"""Corrupt real-data samples on several ranks: every rank that reads data reaches the same verdict on a
batch before the step's first collective, so a sample only one rank decodes is skipped (or stops the run)
everywhere, never raised on one rank while the others wait in a collective. Checked against one process
on the same samples: the losses of a whole epoch and the data report."""

from __future__ import annotations

import json
from pathlib import Path

from mimo.data.tokenizer import ByteTokenizer
from mimo.train.trainer import Trainer
from tests.distributed.test_data_formats import N, data_overrides, make_folder
from tests.support.dist import run_distributed
from tests.support.tiny_run import tiny_config

PLACEHOLDER = 259  # the demo config's images token_id
STEPS = 5  # 5 steps x 8 = one epoch of the N = 40 samples: each sample is seen once


class HashIsPlaceholder(ByteTokenizer):
    """The byte tokenizer, except that '#' encodes to the images placeholder id, as a tokenizer with an
    `<image>` token does for a caption holding that text, and that '!' makes it raise, as a tokenizer's
    own bug would."""

    def encode(self, text: str) -> list[int]:
        if "!" in text:
            raise KeyError("a tokenizer bug")
        return [PLACEHOLDER if b == ord("#") else b for b in text.encode("utf-8")]


def write_manifest(root: Path, captions: dict[int, str]) -> Path:
    """A JSONL manifest of make_folder's N images (samples 7 and 23 have broken image bytes), with the
    caption of sample i replaced by captions[i]."""
    make_folder(root)
    lines = []
    for i in range(N):
        folder = "src/sub" if i % 2 else "src"
        caption = captions.get(i, f"shape {i}")
        lines.append(json.dumps({"image": f"{folder}/img.{i:03d}.png", "caption": caption}))
    path = root / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _trainer(out: Path, manifest: Path) -> Trainer:
    tr = Trainer(tiny_config(out, *data_overrides("jsonl", manifest, f"--train.steps={STEPS}")))
    tr.data.tok = HashIsPlaceholder()  # read by the samples' decoder when the first step starts
    return tr


def _epoch(rank: int, world: int, out: str, manifest: str) -> tuple[list[float], dict]:
    tr = _trainer(Path(out), Path(manifest))
    return [tr.train_step(s)["loss"] for s in range(STEPS)], tr.data.report()


def _failing_step(rank: int, world: int, out: str, manifest: str) -> str:
    tr = _trainer(Path(out), Path(manifest))
    try:
        for s in range(STEPS):
            tr.train_step(s)
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_wrong_placeholder_count_on_one_rank_is_skipped_on_both(tmp_path):
    # sample 12's caption gives one placeholder too many; only the rank whose LM lane holds it decodes its text
    manifest = write_manifest(tmp_path, {12: "a # too many"})
    one = _trainer(tmp_path / "one", manifest)
    expected = [one.train_step(s)["loss"] for s in range(STEPS)]
    assert one.data.report()["corrupt_samples"] == 3  # samples 7, 23 (images) and 12 (placeholders)
    results = run_distributed(_epoch, 2, str(tmp_path / "two"), str(manifest), timeout=300)
    for losses, report in results:
        assert report == one.data.report()
        assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(expected, losses)), (expected, losses)


def test_unexpected_sample_error_stops_both_ranks_with_its_message(tmp_path):
    manifest = write_manifest(tmp_path, {30: "tokenizer breaks here!"})
    messages = run_distributed(_failing_step, 2, str(tmp_path / "two"), str(manifest), timeout=300)
    own = [m for m in messages if "sample 'line 31' failed to load: KeyError('a tokenizer bug')" in m]
    pointer = [m for m in messages if "failed to load on another rank" in m]
    assert len(own) == 1 and len(pointer) == 1, messages
