"""A checkpoint written with one layout loads into another: DP=2 -> TP=2 (+SP) -> one process.

The evaluation loss of the loaded model matches the writer's to 1e-5 relative, and so does the loss
of the next training step and the evaluation after it, which needs the optimizer's moments to have
been resharded correctly too.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mimo.data.batching import to_device
from mimo.models.loss import loss_weights
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.tiny_run import tiny_config

COMMON = ["--train.steps=6", "--model.llm.kv_heads=2"]
TP2 = ["--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true",
       "--parallel.modules.images.tp=2"]
EVAL_STEP = 1000
"""A global batch the training never reaches, used as the held-out batch."""


@torch.no_grad()
def eval_loss(tr: Trainer) -> float:
    """Collective: the per-token loss of one held-out global batch under the trainer's layout."""
    batch = tr.data.global_batch(EVAL_STEP, tr.cfg.data.global_batch, tr.cfg.data.seed)
    micro = [to_device(mb, tr.device) for mb in tr.local_microbatches(batch)]
    loss = sum(tr.model(**mb).loss_sum for mb in micro)
    tokens = sum(loss_weights(mb["labels"], mb.get("loss_mask")).sum() for mb in micro).float()
    return float(tr.all_reduce_sum(loss) / tr.all_reduce_sum(tokens))


def _continue(tr: Trainer, start: int) -> tuple[float, float, float]:
    """(eval loss now, loss of the next step, eval loss after it)."""
    before = eval_loss(tr)
    tr.model.train()
    step_loss = tr.train_step(start)["loss"]
    return before, step_loss, eval_loss(tr)


def write_dp2(rank: int, world: int, out: str) -> tuple[float, float, float]:
    tr = Trainer(tiny_config(Path(out), *COMMON, "--train.save_every=4", "--train.keep_checkpoints=3"))
    tr.train()
    return _continue(tr, 6)


def read_tp2(rank: int, world: int, out: str) -> tuple[float, float, float]:
    tr = Trainer(tiny_config(Path(out) / "tp2", *COMMON, *TP2, f"--train.resume={_ckpt(out)}"))
    assert set(tr.checkpointer.tp_meshes) == {"language", "images"}
    assert tr.checkpointer.resume() == 6
    return _continue(tr, 6)


def _ckpt(out: str) -> Path:
    return Path(out) / "tiny" / "checkpoints" / "step_00000006"


def _close(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b))


def test_dp2_checkpoint_loads_into_tp2_and_into_one_process(tmp_path):
    written = run_distributed(write_dp2, 2, str(tmp_path), timeout=240)[0]
    loaded = run_distributed(read_tp2, 2, str(tmp_path), timeout=240)
    assert loaded[0] == loaded[1]
    assert _close(written, loaded[0]), (written, loaded[0])

    single = Trainer(tiny_config(tmp_path / "one", *COMMON, f"--train.resume={_ckpt(str(tmp_path))}"))
    assert single.checkpointer.resume() == 6
    assert _close(written, _continue(single, 6)), written
