"""`hf_path` MoE weights load under expert parallelism with each rank reading only its experts: a `Trainer` on
LM ep2 (and ep2 with FSDP) over a Qwen3-MoE checkpoint holds, gathered whole, exactly the single-process model,
and each rank reads well under the checkpoint's elements."""

from __future__ import annotations

import pytest
import torch

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.hf_helpers import perturb, record_reads, save, tiny_causal_lm, tiny_vision_config, transformers
from tests.support.tiny_run import tiny_config

LANG = "--parallel.modules.language"
LAYOUTS = {"ep2": [f"{LANG}.ep=2"], "ep2_fsdp": [f"{LANG}.ep=2", f"{LANG}.fsdp=true"]}


def _config(out, lm_dir, tower_dir, *overrides):
    return tiny_config(out, "--model.llm.heads=4", "--model.llm.kv_heads=2", "--model.llm.layers=3",
                       "--model.llm.moe_experts=8", "--model.llm.moe_mlp=24", f"--model.llm.hf_path={lm_dir}",
                       f"--model.modalities.images.hf_path={tower_dir}", *overrides)


def _load(rank: int, world: int, out: str, lm_dir: str, tower_dir: str, layout: list[str]) -> dict:
    reads: list[int] = []
    record_reads(reads)
    trainer = Trainer(_config(out, lm_dir, tower_dir, *layout))
    experts = {n: p.shape[0] for n, p in trainer.model.named_parameters() if n.endswith("w_up")}
    full = trainer.plan.gather_full(trainer.model)
    return {"read": sum(reads), "experts": experts, "params": {n: t.numpy() for n, t in full.items()}}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    lm = perturb(tiny_causal_lm("qwen3_moe", vocab_size=272))
    torch.manual_seed(0)
    tower = perturb(transformers.CLIPVisionModel(tiny_vision_config("clip", image_size=32, patch_size=16)).eval())
    experts = sum(t.numel() for n, t in lm.state_dict().items() if ".experts." in n)
    return save(lm, root / "lm"), save(tower, root / "tower"), experts


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_hf_moe_weights_load_under_expert_parallel_reading_only_this_ranks_experts(tmp_path, hf_dirs, name):
    lm_dir, tower_dir, experts = hf_dirs
    ref = Trainer(_config(tmp_path / "ref", lm_dir, tower_dir)).model
    ref_params = {n: p.detach() for n, p in ref.named_parameters()}
    results = run_distributed(_load, 2, str(tmp_path / name), str(lm_dir), str(tower_dir), LAYOUTS[name], timeout=240)
    got = results[0]["params"]
    assert sorted(got) == sorted(ref_params)
    for n, t in ref_params.items():
        assert torch.equal(torch.from_numpy(got[n]), t), f"{name}: {n} differs from the single-process load"
    assert all(set(r["experts"].values()) == {4} for r in results), [r["experts"] for r in results]
    whole = sum(t.numel() for t in ref.state_dict().values())
    for r in results:  # half the experts (a quarter of them per rank with FSDP), everything else whole
        assert r["read"] <= whole - experts // 2, (name, r["read"], whole, experts)
