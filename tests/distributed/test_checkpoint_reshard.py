"""A checkpoint written with one layout loads into another: DP=2 -> TP=2 (+SP) -> one process.

The evaluation loss of the loaded model matches the writer's to 1e-5 relative, and so does the loss
of the next training step and the evaluation after it, which needs the optimizer's moments to have
been resharded correctly too.
"""

from __future__ import annotations

from pathlib import Path

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.reshard import continue_run, params_close
from tests.support.tiny_run import tiny_config

COMMON = ["--train.steps=6", "--model.llm.kv_heads=2"]
TP2 = ["--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true",
       "--parallel.modules.images.tp=2"]
"""A global batch the training never reaches, used as the held-out batch."""


def write_dp2(rank: int, world: int, out: str) -> tuple[float, float, float]:
    tr = Trainer(tiny_config(Path(out), *COMMON, "--checkpoint.save_every=4", "--checkpoint.keep=3"))
    tr.train()
    return continue_run(tr, 6)


def read_tp2(rank: int, world: int, out: str) -> tuple[float, float, float]:
    tr = Trainer(tiny_config(Path(out) / "tp2", *COMMON, *TP2, f"--checkpoint.resume={_ckpt(out)}"))
    assert set(tr.checkpointer.tp_meshes) == {"language", "images"}
    assert tr.checkpointer.resume() == 6
    return continue_run(tr, 6)


def _ckpt(out: str) -> Path:
    return Path(out) / "tiny" / "checkpoints" / "step_00000006"


def test_dp2_checkpoint_loads_into_tp2_and_into_one_process(tmp_path):
    written = run_distributed(write_dp2, 2, str(tmp_path), timeout=240)[0]
    loaded = run_distributed(read_tp2, 2, str(tmp_path), timeout=240)
    assert loaded[0] == loaded[1]
    assert params_close(written, loaded[0]), (written, loaded[0])

    single = Trainer(tiny_config(tmp_path / "one", *COMMON, f"--checkpoint.resume={_ckpt(str(tmp_path))}"))
    assert single.checkpointer.resume() == 6
    assert params_close(written, continue_run(single, 6)), written
