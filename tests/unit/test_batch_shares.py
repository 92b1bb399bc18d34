"""summary.json's and the progress bar's padding share (the row tokens of the run's batches that hold no sample)
against a hand count of the data set's batches and against packing's own report; summary.json's module FLOP shares
against the FLOPs formula applied by hand."""

from __future__ import annotations

import json

import torch

from mimo.config.schema import ModelConfig
from mimo.data.tokenizer import ByteTokenizer
from mimo.models.flops import lm_flops, projector_flops, vit_flops
from mimo.models.loss import IGNORE_INDEX
from mimo.train.batch_shares import BatchShares
from mimo.train.trainer import Trainer
from tests.support.tiny_run import tiny_config

PAD = ByteTokenizer.PAD


def summary(out_dir) -> dict:
    return json.loads((out_dir / "tiny" / "summary.json").read_text())


def test_an_unpacked_run_reports_the_padding_of_its_batches(tmp_path, capsys):
    cfg = tiny_config(tmp_path, "--train.steps=3", "--metrics.progress=true")
    trainer = Trainer(cfg)
    trainer.train()
    d = cfg.data
    batches = [trainer.data.global_batch(step, d.global_batch, d.seed) for step in range(3)]
    real = sum(int((b["input_ids"] != PAD).sum()) for b in batches)  # a demo sample's padding closes its row
    rows = sum(b["input_ids"].numel() for b in batches)
    share = summary(tmp_path)["padding_share"]
    assert share == round(1 - real / rows, 4) and 0 < share < 1
    assert f"pad={share:.4g}" in capsys.readouterr().err  # the bar's last state
    m = cfg.model
    vit = m.modalities["images"].vit
    lm = sum(b["input_ids"].shape[0] * lm_flops(m.llm, b["input_ids"].shape[1]) for b in batches)
    images = sum(int(b["modality_counts"]["images"].sum()) if "modality_counts" in b else b["input_ids"].shape[0]
                 for b in batches)
    encoder = images * (vit_flops(vit) + projector_flops(vit.hidden, m.llm.hidden, vit.tokens_per_image))
    assert summary(tmp_path)["flops_share"] == {"language": round(lm / (lm + encoder), 4),
                                                "images": round(encoder / (lm + encoder), 4)}


def test_a_packed_run_reports_the_padding_left_after_packing(tmp_path):
    Trainer(tiny_config(tmp_path, "--train.steps=3", "--data.packing=true", "--data.pack_length=256")).train()
    out = summary(tmp_path)
    assert out["padding_share"] == out["padding"]["padding_after"] != out["padding"]["padding_before"]


_MODEL = ModelConfig()


class _Data:
    tok = ByteTokenizer()
    text_rows = None


def _batch() -> dict:
    ids = torch.full((3, 8), PAD)
    ids[0, :5] = 7  # 5 tokens
    ids[1, :2] = 7  # 2 tokens, then a label on a pad id: 4 tokens
    labels = torch.full((3, 8), IGNORE_INDEX)
    labels[1, 3] = PAD
    ids[2, :] = 7  # a full row
    return {"input_ids": ids, "labels": labels}


def test_the_tally_counts_each_rows_prefix_and_only_the_rows_this_rank_holds():
    tally = BatchShares(_Data(), _MODEL)
    assert tally.padding() is None and tally.postfix() == {}
    tally.count(_batch())
    assert tally.padding() == round(1 - (5 + 4 + 8) / 24, 4) and tally.postfix() == {"pad": tally.padding()}
    assert tally.flops() == {"language": 1.0}  # a text batch: the LM's work only
    sharded = _Data()
    sharded.text_rows = {0, 2}
    tally = BatchShares(sharded, _MODEL)
    tally.count(_batch())
    assert tally.padding() == round(1 - (5 + 8) / 16, 4)


def test_a_data_set_without_a_tokenizer_has_full_rows():
    tally = BatchShares(object(), _MODEL)
    tally.count(_batch())
    assert tally.padding() == 0.0
