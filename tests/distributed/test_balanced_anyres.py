"""`data.balance_lanes = true` on an anyres modality: the JSONL manifest of tests.unit.test_anyres_data (images of five
sizes, cut into 3 or 5 tiles at its pinpoints, a sample of two images, a text-only one, a missing image and a video,
both skipped), rows priced by their tiles (mimo.models.flops.anyres_flops). Every rank reads the whole batch; three
Trainer steps on 2 gloo ranks (dp2, dp2 x 2 microbatches, the colocated fan-in: tower dp2 into LM tp2, and dp2 under
OneVision's anyres_max_1, where the two-image sample's images are one untiled square tile each) give the single
process's (unbalanced) losses, gradients and final weights within 1e-5 relative, while the balance lowered the
heaviest lane's cost on at least one step of every layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo.train.trainer import Trainer
from tests.support.anyres_data import jsonl
from tests.support.dist import run_distributed
from tests.support.parity import assert_trains_like, assert_weights_like, trainer_steps
from tests.support.tiny_run import tiny_config

RTOL = 1e-5
STEPS = 3
LANG = "--parallel.modules.language"
COMMON = ["--model.llm.layers=2", "--model.llm.heads=4", "--model.llm.kv_heads=2", "--optim.eps=1e-2",
          "--data.seed=3", "--data.global_batch=8"]
ONEVISION = ["--model.modalities.images.anyres_max_tiles=1"]  # the two-image sample's images: one tile each
LAYOUTS = {"dp2": ([], []), "dp2_mb2": ([], ["--parallel.microbatches=2"]), "fan_in2": ([], [f"{LANG}.tp=2"]),
           "onevision_dp2": (ONEVISION, [])}
"""name -> (the model's overrides, on both runs; the layout's, on the ranks)."""


def _train(out: Path, data: list[str], *overrides: str) -> tuple:
    trainer = Trainer(tiny_config(out, *data, *COMMON, *overrides))
    losses, grads = trainer_steps(trainer, STEPS)
    weights = trainer.plan.gather_full(trainer.model)
    seen = trainer.balancer.seen if trainer.balancer is not None else []
    return (losses, [{n: g.numpy() for n, g in step.items()} for step in grads],
            {n: w.numpy() for n, w in weights.items()}, seen)


def _rank(rank: int, world: int, out: str, data: list[str], layout: list[str]) -> tuple:
    return _train(Path(out), data, *layout, "--data.balance_lanes=true")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_balanced_anyres_lanes_train_like_one_process(tmp_path, layout):
    model, ranks = LAYOUTS[layout]
    data = [*jsonl(tmp_path), *model]
    losses, grads, weights, _ = _train(tmp_path / "one", data)
    got = run_distributed(_rank, 2, str(tmp_path / layout), data, ranks, timeout=300)[0]
    seen = got[3]
    assert len(seen) == STEPS and all(f["lane_imbalance"] <= f["lane_imbalance_before"] for f in seen), seen
    assert any(f["lane_imbalance"] < f["lane_imbalance_before"] for f in seen), seen
    assert_trains_like(f"balanced anyres {layout}", got[:2], (losses, grads), RTOL)
    assert_weights_like(f"balanced anyres {layout}", got[2], weights, RTOL)
