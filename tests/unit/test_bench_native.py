"""bench_native on the CPU at its tiny size: both sides (mimo's Trainer and transformers' Qwen2.5-VL) train on the
manifest's batches and give a row, and the two models give one fp32 loss on the first batch with the same weights
(so the ratio compares one computation)."""

import json
import math

import pytest
import torch

from benchmarks.bench_native import main
from benchmarks.hf_native_worker import build_hf_model
from benchmarks.native_workload import hf_batch, model_inputs, native_batches, native_config, write_manifest
from mimo.export.qwen2_vl import export_qwen2_vl
from mimo.models.build import build_model
from tests.support.hf_helpers import perturb, transformers

pytestmark = pytest.mark.usefixtures("one_thread")


def test_both_sides_train_on_the_mixed_sizes_and_give_a_ratio(tmp_path, capsys):
    main(["--size", "tiny", "--out", str(tmp_path), "--steps", "2", "--warmup", "1"])
    rows = [json.loads(line) for line in (tmp_path / "native_tiny.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == ["mimo", "hf eager"]
    for r in rows:
        assert "error" not in r, r
        assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0 and math.isfinite(r["final_loss"])
    assert rows[0]["patches_per_step"] == rows[1]["patches_per_step"] > 0
    assert rows[0]["train"]["device"] == "cpu" and rows[1]["attn"] == "sdpa"
    table = (tmp_path / "native_tiny.md").read_text()
    assert "mimo / hf eager (the fastest baseline): " in table and table in capsys.readouterr().out + "\n"


def test_a_batch_holds_one_large_and_several_small_images_of_other_sizes(tmp_path):
    write_manifest("tiny", tmp_path)
    cfg = native_config("tiny", tmp_path)
    first, second = native_batches(cfg, 2)
    grids = first["modality_inputs"]["images"]["visual"]["grid_thw"]
    counts = first["modality_counts"]["images"].tolist()
    assert len(counts) == cfg.data.global_batch and sorted(counts)[0] == 1 and all(c >= 1 for c in counts)
    assert len({tuple(g) for g in grids.tolist()}) >= 3  # sizes differ
    assert grids.prod(-1).max() >= 2 * grids.prod(-1).min()
    assert (first["labels"] != -100).sum() > 0 and first["input_ids"].shape == (cfg.data.global_batch, cfg.data.seq_len)
    other = second["modality_inputs"]["images"]["visual"]["grid_thw"]
    assert sorted(other.tolist()) == sorted(grids.tolist())  # the same items, every step, in another order


def test_the_baselines_model_gives_mimos_fp32_loss_on_the_first_batch(tmp_path):
    write_manifest("tiny", tmp_path)
    cfg = native_config("tiny", tmp_path)
    batch = native_batches(cfg, 1)[0]
    torch.manual_seed(0)
    model = perturb(build_model(cfg.model)).eval()
    export_qwen2_vl(model, tmp_path / "hf")
    hf = build_hf_model(cfg, "sdpa").eval()
    hf.load_state_dict(transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path / "hf").state_dict())
    with torch.no_grad():
        out = model(**model_inputs(batch))
        ours = out.loss_sum / out.num_tokens
        inputs = hf_batch(batch)
        ref = hf(**inputs).loss
        flipped = hf(**{**inputs, "pixel_values": inputs["pixel_values"].flip(0)}).loss
        text_positions = hf(**{**inputs, "position_ids": torch.arange(cfg.data.seq_len).expand(3, 3, -1)}).loss
    assert abs(float(ours) - float(ref)) <= 1e-5 * abs(float(ref))
    for other in (flipped, text_positions):  # the loss sees the pixels and the M-RoPE positions
        assert abs(float(other) - float(ref)) > 1e-3 * abs(float(ref))
