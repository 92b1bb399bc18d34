"""An expert-parallel run trains through the Trainer, and its sharded checkpoint reshards: ep2 over 4 ranks
(each rank saving only its experts; with FSDP only its shard of them) -> ep4 -> one process.

The evaluation loss of the loaded model matches the writer's to 1e-5 relative, and so does the loss of the
next training step and the evaluation after it (the experts' Adam moments resharded too). The writer's
first steps also match one process's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.reshard import continue_run, params_close
from tests.support.tiny_run import metrics, tiny_config

MOE = ["--train.steps=4", "--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_top_k=2",
       "--model.llm.moe_aux_loss_weight=0.01", "--data.global_batch=8", "--train.log_every=1"]
LANG = "--parallel.modules.language"


def _ckpt(out: str) -> Path:
    return Path(out) / "tiny" / "checkpoints" / "step_00000004"


def write_ep2(rank: int, world: int, out: str, fsdp: bool) -> tuple[float, float, float]:
    layout = [f"{LANG}.ep=2", f"{LANG}.fsdp={str(fsdp).lower()}"]
    tr = Trainer(tiny_config(Path(out), *MOE, *layout, "--checkpoint.save_every=4"))
    assert tr.checkpointer.expert_mesh.ndim == (2 if fsdp else 1)
    tr.train()
    return continue_run(tr, 4)


def read_ep4(rank: int, world: int, out: str) -> tuple[float, float, float]:
    tr = Trainer(tiny_config(Path(out) / "ep4", *MOE, f"{LANG}.ep=4", f"--checkpoint.resume={_ckpt(out)}"))
    assert tr.checkpointer.resume() == 4
    return continue_run(tr, 4)


@pytest.mark.parametrize("fsdp", [False, True])
def test_ep2_trains_like_one_process_and_its_checkpoint_loads_into_ep4_and_one_process(tmp_path, fsdp):
    written = run_distributed(write_ep2, 4, str(tmp_path), fsdp, timeout=300)[0]
    Trainer(tiny_config(tmp_path / "ref", *MOE)).train()
    got, ref = metrics(tmp_path), metrics(tmp_path / "ref")
    assert len(got) == len(ref) == 4
    for a, b in zip(got, ref):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a, b)

    loaded = run_distributed(read_ep4, 4, str(tmp_path), timeout=300)
    assert all(r == loaded[0] for r in loaded)
    assert params_close(written, loaded[0]), (written, loaded[0])
    single = Trainer(tiny_config(tmp_path / "one", *MOE, f"--checkpoint.resume={_ckpt(str(tmp_path))}"))
    assert single.checkpointer.resume() == 4
    assert params_close(written, continue_run(single, 4)), written
