"""`precision.module_dtype` in a pipeline on 2 gloo ranks (encoder and language model on different ranks): each
module computes in its own dtype."""

from __future__ import annotations

from pathlib import Path

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.precision_probe import LM_LINEAR, PROJECTOR, VIT_LINEAR, record_dtypes
from tests.support.tiny_run import tiny_config

PIPELINE = ["--parallel.modules.images.size=1", "--parallel.modules.language.offset=1",
            "--parallel.modules.language.size=1"]


def _pipeline_rank(rank: int, world: int, out_dir: str) -> dict[str, list[str]]:
    trainer = Trainer(tiny_config(Path(out_dir), "--precision.dtype=bfloat16",
                                  "--precision.module_dtype.images=float32", *PIPELINE))
    seen = record_dtypes(trainer.model)
    assert trainer.train_step(0)["stepped"]
    return {name: sorted({str(d) for d in dtypes}) for name, dtypes in seen.items() if dtypes}


def test_module_dtypes_hold_in_a_pipeline_on_two_ranks(tmp_path):
    encoder_rank, lm_rank = run_distributed(_pipeline_rank, 2, str(tmp_path), timeout=120)
    assert encoder_rank == {VIT_LINEAR: ["torch.float32"], PROJECTOR: ["torch.float32"]}
    assert lm_rank == {LM_LINEAR: ["torch.bfloat16"]}
