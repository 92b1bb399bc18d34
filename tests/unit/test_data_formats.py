"""Real data formats: WebDataset shards (made by make_shards) and JSONL manifests, with corrupt samples
skipped and counted exactly, a deterministic resumable order and worker processes."""

from __future__ import annotations

import json
import tarfile

import pytest
import torch

from mimo.data.image_text import ImageTextData
from mimo.data.jsonl import read_manifest
from mimo.data.make_shards import main as make_shards_main
from mimo.data.samples import BadSample, Record, encode_text
from mimo.data.tokenizer import ByteTokenizer
from mimo.data.webdataset import read_shard, read_webdataset
from mimo.models.loss import IGNORE_INDEX
from mimo.train.trainer import Trainer
from tests.support.data_folders import N, data_overrides, make_folder
from tests.support.tiny_run import tiny_config


def test_webdataset_with_5_percent_corrupt_images_trains_and_counts_them(tmp_path, capsys):
    src = make_folder(tmp_path)
    make_shards_main([str(src), str(tmp_path / "shards"), "--samples-per-shard", "16"])
    assert "no_caption.png' has no .txt or .json" in capsys.readouterr().err
    shards = sorted((tmp_path / "shards").glob("*.tar"))
    assert [p.name for p in shards] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    records, problems = read_webdataset(str(tmp_path / "shards" / "shard-{000000..000002}.tar"))
    assert len(records) == N and not problems and records[-1].key == "sub/img_039"

    # 5 steps x 8 = one epoch: every sample is seen exactly once
    cfg = tiny_config(tmp_path, *data_overrides("webdataset", tmp_path / "shards", "--train.steps=5"))
    summary = Trainer(cfg).train()
    report = summary["eval"]["data"]
    assert report == {"samples": N, "text_only_samples": 0, "skipped_rows": 2, "corrupt_samples": 2,
                      "source_problems": []}
    assert summary["steps"] == 5 and summary["final_loss"] == summary["final_loss"]  # finite, not NaN
    err = capsys.readouterr().err
    assert "skipped sample 'sub/img_007'" in err and "skipped sample 'sub/img_023'" in err


def test_jsonl_manifest_with_workers_and_bad_lines(tmp_path):
    src = make_folder(tmp_path, corrupt={5})
    lines = []
    for i in range(N):
        folder = "src/sub" if i % 2 else "src"
        meta = json.loads((tmp_path / folder / f"img.{i:03d}.json").read_text()) if i % 3 == 0 else \
            {"caption": (tmp_path / folder / f"img.{i:03d}.txt").read_text()}
        lines.append(json.dumps({"image": f"{folder}/img.{i:03d}.png", **meta}))
    lines[11] = '{"image": "src/sub/img.011.png", "caption": '  # cut-off JSON
    lines[12] = json.dumps({"image": "src/missing.png", "caption": "x"})
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("\n".join(lines) + "\n\n")
    records, _ = read_manifest(manifest)
    assert len(records) == N and "not valid JSON" in records[11].problem
    assert src.is_dir()

    cfg = tiny_config(tmp_path, *data_overrides("jsonl", manifest, "--train.steps=5", "--data.workers=2"))
    summary = Trainer(cfg).train()
    assert summary["eval"]["data"]["corrupt_samples"] == 3 and summary["eval"]["data"]["skipped_rows"] == 3


def test_order_is_deterministic_and_resumable(tmp_path):
    src = make_folder(tmp_path, corrupt=set())
    make_shards_main([str(src), str(tmp_path / "shards")])
    records, _ = read_webdataset(str(tmp_path / "shards"))
    data = ImageTextData(records, ByteTokenizer(), 32, 4, 259, 32)
    seq = [data.global_batch(s, 8, 3) for s in range(4)]
    jumped = ImageTextData(records, ByteTokenizer(), 32, 4, 259, 32).global_batch(2, 8, 3)
    for k in ("input_ids", "labels"):
        assert torch.equal(seq[2][k], jumped[k])
    assert torch.equal(seq[2]["modality_inputs"]["images"]["vit"]["pixel_values"],
                       jumped["modality_inputs"]["images"]["vit"]["pixel_values"])
    assert not torch.equal(seq[1]["input_ids"], seq[2]["input_ids"])


def test_text_layout_and_pluggable_tokenizer():
    class Words:
        """A Hugging Face-like tokenizer: encode/decode plus *_token_id attributes."""

        bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [10 + len(w) for w in text.split()]

        def decode(self, ids: list[int]) -> str:
            return " ".join("x" * (i - 10) for i in ids)

    chat = Record("k", turns=(("human", "<image> what is it"), ("gpt", "a red circle")))
    ids, labels = encode_text(chat, Words(), 3, 99, 16)
    assert ids == [1, 99, 99, 99, 14, 12, 12, 11, 13, 16, 2]
    assert labels[:6] == [IGNORE_INDEX] * 6 and labels[6:] == [11, 13, 16, 2, IGNORE_INDEX]
    with pytest.raises(BadSample, match="no answer token fits"):
        encode_text(chat, Words(), 3, 99, 6)
    with pytest.raises(BadSample, match="caption is empty"):
        encode_text(Record("k", caption=""), ByteTokenizer(), 3, 99, 16)


def test_damaged_shard_keeps_earlier_samples(tmp_path):
    src = make_folder(tmp_path, corrupt=set())
    make_shards_main([str(src), str(tmp_path / "shards")])
    shard = tmp_path / "shards" / "shard-000000.tar"
    with tarfile.open(shard) as tar:
        cut = [m for m in tar.getmembers()][20].offset
    shard.write_bytes(shard.read_bytes()[: cut + 100])
    records, problem = read_shard(shard)
    assert 9 <= len(records) <= 11 and "damaged" in problem
