"""On a pipelined layout (the encoder on rank 0, the MoE LM in two stages on ranks 1-2) `mimo train` logs one
process's router losses and expert loads, its logged loss includes the router objective, and the sigmoid
router's balancing bias moves alike."""

import pytest

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.tiny_run import metrics, tiny_config, train_rank

MOE = ["--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_top_k=2", "--model.llm.layers=2",
       "--model.llm.moe_aux_loss_weight=0.05", "--model.llm.moe_z_loss_weight=0.01", "--model.llm.moe_gating=sigmoid",
       "--model.llm.moe_norm_topk=true", "--model.llm.moe_bias_rate=0.01", "--train.steps=3",
       "--parallel.microbatches=2"]
PIPELINE = ["--parallel.modules.images.offset=0", "--parallel.modules.images.size=1",
            "--parallel.modules.language.offset=1", "--parallel.modules.language.size=2",
            "--parallel.modules.language.pp=2"]
KEYS = ("loss", "moe_aux_loss", "moe_z_loss")


def test_a_pipelined_moe_lm_logs_what_one_process_does(tmp_path):
    Trainer(tiny_config(tmp_path / "one", *MOE)).train()
    run_distributed(train_rank, 3, str(tmp_path / "pipe"), [*MOE, *PIPELINE], timeout=600)
    one, pipe = ([r for r in metrics(tmp_path / name) if "moe_load" in r] for name in ("one", "pipe"))
    assert len(one) == len(pipe) == 3
    for a, b in zip(one, pipe):
        for key in KEYS:
            assert b[key] == pytest.approx(a[key], rel=1e-5), key
        for layer in ("0", "1"):
            assert b["moe_load"][layer] == pytest.approx(a["moe_load"][layer], abs=1e-6)
