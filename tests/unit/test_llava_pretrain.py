"""The LLaVA-Pretrain layout: one .json array of {"id", "image", "conversations"} beside an images/ folder
(data.image_root), read as it is. Oracle: the same samples as a .jsonl manifest with absolute image paths
train to the same losses."""

from __future__ import annotations

import json

import pytest

from mimo.config.schema import ConfigError
from mimo.data.jsonl import read_manifest
from mimo.train.trainer import Trainer
from tests.support.llava_pretrain import N, make_llava_pretrain
from tests.support.tiny_run import metrics, tiny_config


def test_reading_the_layout(tmp_path):
    base = make_llava_pretrain(tmp_path)
    records, problems = read_manifest(base / "blip_laion_cc_sbu_558k.json", image_root=str(base / "images"))
    assert len(records) == N + 1 and problems == []
    assert records[9].image.path == str(base / "images" / "00001" / "000000009.jpg")
    assert records[9].turns[1][0] == "gpt" and records[9].turns[0][1].endswith("<image>")
    assert records[N].text_only and records[N].problem == ""  # no image, no <image>: a text-only sample
    (tmp_path / "object.json").write_text('{"image": "a.jpg"}')
    with pytest.raises(ConfigError, match="holds a dict, not an array of samples"):
        read_manifest(tmp_path / "object.json")


def test_training_on_it_matches_the_same_samples_as_jsonl(tmp_path):
    base = make_llava_pretrain(tmp_path)
    run = ["--data.name=jsonl", "--data.seq_len=32", "--data.global_batch=8", "--train.steps=3"]
    Trainer(tiny_config(tmp_path / "a", *run, f"--data.path={base / 'blip_laion_cc_sbu_558k.json'}",
                        f"--data.image_root={base / 'images'}")).train()
    items = json.loads((base / "blip_laion_cc_sbu_558k.json").read_text())
    lines = [{**it, "image": str(base / "images" / it["image"])} if "image" in it else it for it in items]
    (tmp_path / "same.jsonl").write_text("".join(json.dumps(it) + "\n" for it in lines))
    Trainer(tiny_config(tmp_path / "b", *run, f"--data.path={tmp_path / 'same.jsonl'}")).train()
    losses = [[r["loss"] for r in metrics(tmp_path / d) if "loss" in r] for d in "ab"]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    summary = json.loads((tmp_path / "a" / "tiny" / "summary.json").read_text())
    assert summary["eval"]["data"]["samples"] == N + 1


def test_a_missing_image_root_is_refused(tmp_path):
    base = make_llava_pretrain(tmp_path)
    with pytest.raises(ConfigError, match="data.image_root = '.*nowhere' is no folder"):
        Trainer(tiny_config(tmp_path, "--data.name=jsonl", "--data.seq_len=32",
                            f"--data.path={base / 'blip_laion_cc_sbu_558k.json'}",
                            f"--data.image_root={tmp_path / 'nowhere'}"))
