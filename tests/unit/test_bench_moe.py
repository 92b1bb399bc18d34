"""bench_moe on the CPU: the whole benchmark at --size tiny (mimo's Trainer row and the transformers row), and
what makes its ratio mean something: the Hugging Face worker's model is mimo's model (the same loss in fp32 on
the same weights and batch, within 1e-5 relative), its batches have mimo's layout and both rows count the
trainer's own FLOPs."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.bench_moe import MODALITY, active_params, moe_config, step_work
from benchmarks.bench_vlm import build_trainer, run_jobs
from benchmarks.loss_check import REFERENCE
from mimo.export.hf import export_llava

transformers = pytest.importorskip("transformers")
from benchmarks.hf_moe_worker import IGNORE, build_hf_model, hf_config, make_batch  # noqa: E402 (needs transformers)

ROOT = Path(__file__).resolve().parents[2]


def test_bench_moe_runs_mimo_and_transformers_on_tiny(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.bench_moe", "--size", "tiny", "--steps", "2", "--warmup", "1",
           "--baseline", "", "--out", str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {row["label"]: row for row in map(json.loads, (tmp_path / "moe_tiny.jsonl").read_text().splitlines())}
    assert set(rows) == {"mimo", "hf eager"}, rows
    for row in rows.values():
        assert row["tokens_per_s"] > 0 and math.isfinite(row["final_loss"]) and math.isfinite(row["step_s_median"])
    assert rows["mimo"]["train"]["master_weights"]
    assert rows["hf eager"]["params_m"] == rows["mimo"]["params_m"]
    table = (tmp_path / "moe_tiny.md").read_text()
    assert "| mimo |" in table and "x hf eager" in table and table in r.stdout


def test_runs_with_no_time_left_of_the_budget_are_skipped_rows(tmp_path):
    row = [sys.executable, "-c", "print('{\"tokens_per_s\": 1.0}')"]
    jobs = [([("a", row)], False), ([("b", row)], True)]
    log, jsonl = tmp_path / "log", tmp_path / "jsonl"
    rows, baselines = run_jobs(jobs, log, jsonl, timeout=60, fail_fast=False)
    assert rows[0]["tokens_per_s"] == 1.0 and baselines[0]["label"] == "b" and "error" not in baselines[0]
    log.write_text("")
    rows, baselines = run_jobs(jobs, log, jsonl, timeout=60, fail_fast=False, budget=0.5)
    assert [r["error"] for r in rows + baselines] == ["skipped: no time left of --budget"] * 2
    assert log.read_text() == ""  # nothing ran


def test_the_hf_worker_computes_mimos_loss_on_the_same_weights_and_batch(tmp_path):
    """mimo's model exported (mimo.export) and loaded into the worker's own LLaVA (strict: the same parameters):
    its loss on mimo's first batch is mimo's first-step loss in fp32."""
    trainer = build_trainer("moe_tiny", f"{REFERENCE},train.device=cpu", tmp_path / "run", 1)
    cfg = trainer.cfg
    hf = build_hf_model(cfg, "cpu")
    exported = transformers.LlavaForConditionalGeneration.from_pretrained(export_llava(trainer.model, tmp_path / "hf"))
    assert exported.config.text_config.model_type == "qwen3_moe"
    hf.load_state_dict(exported.float().state_dict())
    batch = trainer.data.global_batch(0, cfg.data.global_batch, cfg.data.seed)
    labels = torch.full_like(batch["labels"], IGNORE)
    labels[:, 1:] = batch["labels"][:, :-1]  # mimo's labels sit at the predicting position; transformers shifts
    pixels = batch["modality_inputs"][MODALITY]["vit"]["pixel_values"]
    with torch.no_grad():
        ref = float(hf.eval()(input_ids=batch["input_ids"], pixel_values=pixels, labels=labels).loss)
    rec = trainer.train_step(0)
    assert abs(rec["loss"] - ref) <= 1e-5 * abs(ref), (rec["loss"], ref)
    assert rec["flops"] == step_work(cfg)[1] and rec["tokens"] == step_work(cfg)[0]
    ours = make_batch(cfg, "cpu", torch.Generator().manual_seed(1))
    token = cfg.model.modalities[MODALITY].token_id
    assert ours["pixel_values"].shape == pixels.shape and ours["input_ids"].shape == batch["input_ids"].shape
    assert torch.equal(ours["input_ids"] == token, batch["input_ids"] == token)
    assert torch.equal(ours["labels"] == IGNORE, labels == IGNORE)


def test_the_full_size_is_a_3b_qwen3_moe_with_top2_of_16_experts():
    cfg = moe_config("full")
    llm = cfg.model.llm
    assert (llm.moe_experts, llm.moe_top_k, llm.qk_norm, llm.qkv_bias, llm.moe_shared_mlp) == (16, 2, True, False, 0)
    assert not cfg.perf.loss_rows_only and cfg.precision.master_weights
    with torch.device("meta"):
        total = sum(p.numel() for p in transformers.LlavaForConditionalGeneration(hf_config(cfg)).parameters())
    assert 2.9e9 < total < 3.1e9 and 0.75e9 < active_params(cfg) < 0.8e9
