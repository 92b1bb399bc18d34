"""`data.balance_lanes = true` reorders each global batch's rows between data lanes and microbatches by estimated
cost; the step's samples are unchanged, so two `Trainer` steps give the single-process (unbalanced) losses and
gradients within 1e-5 relative. Samples hold 0..3 fixed-size images each (text-only ones included), so costs vary
by images per sample: on the colocated fan-in (encoder dp4 into LM tp2 x dp2, 4 ranks: 4 lanes of 2 rows), on
colocated dp2 with 2 microbatches (2 ranks: 2 lanes x 2 microbatches), and on the 3-rank pipeline (encoder on rank 0,
LM pp2 on ranks 1-2, 2 microbatches). Each run also shows that balancing moved rows and lowered the imbalance.
The same layouts unbalanced against the same reference: tests/distributed/test_mixed_images.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.parity import assert_trains_like, trainer_steps
from tests.support.tiny_run import tiny_config

RTOL = 1e-5
STEPS = 2
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
MIXED = ["--data.min_images_per_sample=0", "--data.images_per_sample=3", "--data.global_batch=8", "--data.seed=3",
         "--model.llm.layers=2", "--model.llm.heads=4", "--model.llm.kv_heads=2", "--optim.eps=1e-2"]
LAYOUTS = {
    "fan_in4": (4, [f"{LANG}.tp=2"]),
    "dp2_mb2": (2, ["--parallel.microbatches=2"]),
    "pipeline3": (3, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2",
                      "--parallel.microbatches=2"]),
}


def _train(out: Path, *overrides: str) -> tuple[list[float], list[dict], list[dict]]:
    trainer = Trainer(tiny_config(out, *MIXED, *overrides))
    losses, grads = trainer_steps(trainer, STEPS)
    seen = trainer.balancer.seen if trainer.balancer is not None else []
    return losses, [{n: g.numpy() for n, g in step.items()} for step in grads], seen


def _rank(rank: int, world: int, out: str, layout: list[str]) -> tuple[list[float], list[dict], list[dict]]:
    return _train(Path(out), *layout, "--data.balance_lanes=true")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[float], list[dict]]:
    threads = torch.get_num_threads()
    losses, grads, _ = _train(tmp_path_factory.mktemp("single"))
    yield losses, grads
    torch.set_num_threads(threads)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_balanced_lanes_train_like_single_process(reference, tmp_path, layout):
    world, overrides = LAYOUTS[layout]
    losses, grads, seen = run_distributed(_rank, world, str(tmp_path), overrides, timeout=600)[0]
    assert len(seen) == STEPS and all(f["lane_imbalance"] <= f["lane_imbalance_before"] for f in seen)
    assert any(f["bin_imbalance"] < f["bin_imbalance_before"] for f in seen), seen
    if layout != "pipeline3":  # one LM lane there: the microbatches are what balancing evens out
        assert any(f["lane_imbalance"] < f["lane_imbalance_before"] for f in seen), seen
    assert_trains_like(layout, (losses, grads), reference, RTOL)
