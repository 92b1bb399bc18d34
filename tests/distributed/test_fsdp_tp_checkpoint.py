"""FSDP over tensor-parallel chunks (LM tp2 x FSDP dp2 on 4 ranks) is checkpointable: every shard of every TP
chunk is saved where it belongs in the full tensor (read back on one process, equal to the ranks' own
gathered weights bit for bit), and a run resumed from its step-2 checkpoint logs the uninterrupted run's
losses and ends in its weights, bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch

from mimo.train.checkpoint.tensors import CheckpointTensors
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.tiny_run import metrics, tiny_config

LANG = "--parallel.modules.language"
RUN = ["--train.steps=4", "--checkpoint.save_every=2", "--checkpoint.keep=4", "--model.llm.heads=4",
       "--model.llm.kv_heads=2", f"{LANG}.tp=2", f"{LANG}.fsdp=true"]


def _step_dir(out: Path, step: int) -> Path:
    return out / "tiny" / "checkpoints" / f"step_{step:08d}"


def train_and_gather(rank: int, world: int, out: str, *extra: str) -> dict[str, torch.Tensor]:
    """Train (maybe resumed), then every parameter gathered over FSDP and TP (rank 0's dict)."""
    tr = Trainer(tiny_config(Path(out), *RUN, *extra))
    assert set(tr.plan.fsdp_modules()) >= {"language"} and tr.checkpointer.tp_meshes["language"].ndim == 2
    tr.train()
    return tr.plan.gather_full(tr.model)


def test_fsdp_over_tp_chunks_saves_every_shard_in_place_and_resumes_bit_for_bit(tmp_path):
    full = run_distributed(train_and_gather, 4, str(tmp_path / "a"), timeout=400)[0]
    step4 = CheckpointTensors(_step_dir(tmp_path / "a", 4))
    lm = [n for n in full if n.startswith("language_model.")]
    assert lm
    for name in full:
        assert torch.equal(step4.read(name), full[name]), name

    resumed = run_distributed(train_and_gather, 4, str(tmp_path / "b"),
                              f"--checkpoint.resume={_step_dir(tmp_path / 'a', 2)}", timeout=400)[0]
    straight, again = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert [r["step"] for r in again][-2:] == [r["step"] for r in straight][-2:]
    assert [r["loss"] for r in again][-2:] == [r["loss"] for r in straight][-2:]
    for name in full:
        assert torch.equal(resumed[name], full[name]), name
