"""`precision.master_weights` checkpoints: the fp32 master weights, moments and step counts (each rank's ZeRO-1
shard) are saved beside the bf16 weights, and a run resumed from step 4 of 6 takes the uninterrupted run's
steps bit for bit, on 1 and on 2 ranks, with FSDP2 of the LM on 2 (its fp32 shards and torch AdamW moments
saved as DTensors) and on the 3-rank pipeline (each stage's own state): the same losses, the same final
weights, the same master state.
A checkpoint of another layout is refused naming why (one of the other optimizer kind: test_master_weights_refusal).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.master_weights import MASTER_SAVES, STEP4
from tests.support.tiny_run import metrics, tiny_config

LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
PIPELINE3 = [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2",
             "--model.llm.layers=2", "--parallel.microbatches=2"]  # encoder on rank 0, LM pp2 on ranks 1-2


def _train_rank(rank: int, world: int, out: str, overrides: list[str]) -> list[np.ndarray]:
    """Train to the end; this rank's master state (every part's shard and step count) and its bf16 weights
    (as fp32, exact), in order."""
    trainer = Trainer(tiny_config(Path(out), *MASTER_SAVES, *overrides))
    trainer.train()
    [parts] = trainer.optimizer.master_state(rank).values()
    weights = [p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().float()
               for p in trainer.model.parameters()]
    moments = [opt.state[p][k] for opt in trainer.optimizer.optimizers.values() for g in opt.param_groups
               for p in g["params"] for k in sorted(opt.state[p])]  # in parameter order (a load refills the dict)
    weights += [v.full_tensor() if hasattr(v, "full_tensor") else v for v in moments]
    return [t.detach().cpu().numpy().copy() for t in [*(t for part in parts.values() for t in part.values()), *weights]]


def _losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in metrics(out)]


@pytest.mark.parametrize("world, layout", [(1, []), (2, []), (2, ["--parallel.modules.language.fsdp=true"]),
                                           (3, PIPELINE3)], ids=["one", "dp2", "fsdp2", "pipeline3"])
def test_resumed_master_weights_run_is_bitwise_the_uninterrupted_one(tmp_path, world, layout):
    ref, resumed = tmp_path / "ref", tmp_path / "resumed"
    ref_state = run_distributed(_train_rank, world, str(ref), layout, timeout=300)
    got_state = run_distributed(_train_rank, world, str(resumed), [*layout, f"--checkpoint.resume={ref / STEP4}"],
                                timeout=300)
    assert [s for s, _ in _losses(resumed)] == [4, 5]
    assert _losses(resumed) == _losses(ref)[4:]
    for rank, (got, want) in enumerate(zip(got_state, ref_state, strict=True)):
        assert len(got) == len(want) > 0, rank
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), rank
    if world == 2:  # the fp32 state is this layout's shards: one process cannot take it
        with pytest.raises(ValueError, match=r"sharded over the layout it was written with \(2 ranks"):
            one = Trainer(tiny_config(tmp_path / "one", *MASTER_SAVES, f"--checkpoint.resume={ref / STEP4}"))
            one.checkpointer.resume()
