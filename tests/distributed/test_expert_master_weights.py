"""`train.master_weights` beside expert parallelism: LM ep2 with FSDP2 (its fp32 shards, experts over their edp
ranks, are the master weights) trains like the single-process master_weights run of the same MoE model, within
the bf16 bounds of tests/distributed/test_master_weights_layouts.py; without FSDP the gate refuses it, and the GPU
defaults leave it off."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.config.schema import ConfigError
from mimo.parallel.layout import Layout
from mimo.perf.gpu_defaults import apply_gpu_defaults
from mimo.train.gate import validate_run
from tests.distributed.test_master_weights_layouts import LANG, LOSS_RTOL, MASTER, MASTER_OF_MOVE, MODEL, train
from tests.support.dist import run_distributed
from tests.support.tiny_run import tiny_config

MOE = ["--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_top_k=2"]
EP_FSDP = [f"{LANG}.ep=2", f"{LANG}.fsdp=true"]


def _rank(rank: int, world: int, out: str) -> dict:
    return train(Path(out), *MOE, *EP_FSDP, *MASTER)


def test_master_weights_train_under_expert_parallel_fsdp(tmp_path):
    ref = train(tmp_path / "ref", *MOE, *MASTER)
    run = run_distributed(_rank, 2, str(tmp_path / "ep"), timeout=600)[0]
    for step, (a, b) in enumerate(zip(run["losses"], ref["losses"], strict=True)):
        assert abs(a - b) <= LOSS_RTOL * abs(b), f"step {step}: loss {a} vs one-process master {b}"
    assert run["master"].keys() == ref["master"].keys()
    worst = max(float(abs(run["master"][n] - ref["master"][n]).max()) for n in ref["master"])
    move = max(float(abs(ref["master"][n] - ref["initial"][n]).max()) for n in ref["master"])
    assert worst <= MASTER_OF_MOVE * move, f"master weights differ by {worst}, training moved them {move}"
    assert set(run["fsdp"]) == {"language"}


def test_master_weights_under_expert_parallel_need_fsdp(tmp_path):
    cfg = tiny_config(tmp_path, *MODEL, *MOE, f"{LANG}.ep=2", *MASTER)
    with pytest.raises(ConfigError,
                       match="ep = 2 with train.master_weights = true needs parallel.modules.language.fsdp = true"):
        validate_run(cfg, 2)


def test_gpu_defaults_leave_master_weights_off_under_expert_parallel_without_fsdp(tmp_path):
    for layout, expected in (([f"{LANG}.ep=2"], False), (EP_FSDP, True)):
        cfg = tiny_config(tmp_path, *MODEL, *MOE, *layout, "--train.device=cuda")
        applied = apply_gpu_defaults(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))
        assert applied.get("master_weights", False) is expected, (layout, applied)
