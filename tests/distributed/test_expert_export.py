"""An expert-parallel run exports like one process: LM ep2 (and ep2 with FSDP2) over 2 ranks trains a Mixtral-shaped
MoE VLM for two steps and ends in a sharded checkpoint (each rank its experts); `mimo export` streams it into a
Hugging Face LLaVA directory whose logits in `transformers` equal those of the single-process run's export
(fp32, within 1e-5 relative)."""

from __future__ import annotations

import pytest

from mimo.export.run import export_run
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.hf_helpers import exported_logits, rel_diff
from tests.support.tiny_run import tiny_config

LANG = "--parallel.modules.language"
RUN = ["--train.steps=2", "--optim.eps=1e-2", "--model.llm.heads=2", "--model.llm.kv_heads=2",
       "--model.llm.qkv_bias=false", "--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_top_k=2",
       "--model.llm.moe_norm_topk=true"]
LAYOUTS = {"ep2": [f"{LANG}.ep=2"], "ep2_fsdp": [f"{LANG}.ep=2", f"{LANG}.fsdp=true"]}


def _train(rank: int, world: int, out: str, layout: list[str]) -> str:
    return str(Trainer(tiny_config(out, *RUN, *layout)).train()["checkpoint"])


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_expert_parallel_run_exports_the_single_process_logits(tmp_path, layout):
    ref = Trainer(tiny_config(tmp_path / "ref", *RUN)).train()["checkpoint"]
    run_distributed(_train, 2, str(tmp_path / layout), LAYOUTS[layout], timeout=300)
    single = export_run(ref, tmp_path / "single_hf")
    sharded = export_run(tmp_path / layout / "tiny", tmp_path / f"{layout}_hf")
    assert "Mixtral" in (sharded / "config.json").read_text()
    assert rel_diff(exported_logits(sharded), exported_logits(single)) <= 1e-5
