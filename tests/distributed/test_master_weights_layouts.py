"""`precision.master_weights` on data-parallel layouts: each module's fp32 master weights and moments sharded
ZeRO-1 over its data lanes train like the single-process master_weights run of the same global batch.

Layouts: DP2 (both modules over 2 ranks), the colocated fan-in on 4 ranks (encoder dp4 into LM tp2 x dp2),
FSDP2 of the LM over 2 ranks (bf16 compute through FSDP2's MixedPrecisionPolicy over its fp32 shards, which with
torch's AdamW's fp32 moments are the master state; the encoder DP2 as in the first), and two pipelines: the
3-rank one (encoder on rank 0, LM pp2 on ranks 1-2) and a 4-rank one whose encoder stage is dp2 on ranks 0-1
(its master state sharded over those two lanes) into LM pp2 on ranks 2-3; the 3-rank one also with tied
embeddings (the first and last LM stages each update a copy from the summed gradient); and the encoder dp4 beside
the LM pp2 x dp2 on the same 4 ranks (bf16 rows crossing to the LM's first stage). On a pipeline each stage's
MasterAdamW holds that stage's parameters, and the global norm adds every stage's share.
Each run is a `Trainer` built from the config, as `mimo train` builds it. Compared after STEPS steps:
- against the single-process master_weights run: every step's loss within LOSS_RTOL, and the fp32 master
  weights (gathered whole from the shards) within MASTER_OF_MOVE of the largest distance training moved a
  master weight. The runs differ only in bf16 rounding: the DP run's bf16 gradients are sums of per-lane
  bf16 gradients, each rounded to bf16 (2^-8 relative), and with eps = 1e-2 Adam's update is about
  proportional to the gradient (tests/support/configs.py), so the updates differ by a few such roundings.
  Measured (2026-12-01, this machine): master weights within 1.1% (DP2), 1.3% (fan-in) and 1.1% (FSDP2) of
  the move, losses within 3.2e-5 relative of either reference. A wrong gradient scale (the sum doubled), a
  shard not updated or weights not all-gathered are off by the whole move (100%).
- against the single-process fp32 run: every loss within the loss check's bound (benchmarks/loss_check.py,
  rtol 1e-2).
- the shards: each rank's master state holds 1/N of its module's flat buffer.
On the 3-rank pipeline also: an infinite gradient on one stage skips the step on every stage, and master weights
with every fast path the GPU defaults turn on there stay within the loss check's bound of the fp32 run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mimo.models.layers import SelfAttention
from mimo.perf.apply import ChunkedLMLoss
from mimo.train.trainer import Trainer
from tests.support.dist import run_distributed
from tests.support.master_weights import IMG, LANG, LOSS_RTOL, MASTER, MASTER_OF_MOVE, MODEL, STEPS, train_with_masters
from tests.support.tiny_run import tiny_config

FP32_RTOL = 1e-2  # benchmarks/loss_check.py --rtol
PIPELINE = [f"{IMG}.offset=0", f"{LANG}.pp=2", "--parallel.microbatches=2"]
LAYOUTS = {"dp2": (2, []), "fan_in4": (4, [f"{LANG}.tp=2"]), "fsdp2": (2, [f"{LANG}.fsdp=true"]),
           "pipeline3": (3, [*PIPELINE, f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2"]),
           "pipeline4": (4, [*PIPELINE, f"{IMG}.size=2", f"{LANG}.offset=2", f"{LANG}.size=2"])}
LAYOUTS["colocated_pipeline4"] = (4, [f"{IMG}.tp=1", f"{LANG}.pp=2"])
TIED = ["--model.llm.tie_embeddings=true"]
LAYOUTS["pipeline3_tied"] = (3, [*LAYOUTS["pipeline3"][1], *TIED])
SHARES = {  # per rank: the modules whose master state it holds, and the fraction of each module's flat buffer
    "dp2": [{"language": 1 / 2, "images": 1 / 2}] * 2, "fan_in4": [{"language": 1 / 2, "images": 1 / 4}] * 4,
    "fsdp2": [{"images": 1 / 2}] * 2, "pipeline3": [{"images": 1.0}, {"language": 1.0}, {"language": 1.0}],
    "pipeline4": [{"images": 1 / 2}] * 2 + [{"language": 1.0}] * 2,
    "colocated_pipeline4": [{"language": 1 / 2, "images": 1 / 4}] * 4}
SHARES["pipeline3_tied"] = SHARES["pipeline3"]


def _rank(rank: int, world: int, out: str, layout: list[str]) -> dict:
    return train_with_masters(Path(out), *layout, *MASTER)


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> tuple[dict, dict]:
    threads = torch.get_num_threads()
    master = train_with_masters(tmp_path_factory.mktemp("master"), *MASTER)
    fp32 = train_with_masters(tmp_path_factory.mktemp("fp32"))
    yield master, fp32
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_master_weights_shard_over_data_lanes(tmp_path, layout, references):
    ref, fp32 = references
    world, overrides = LAYOUTS[layout]
    if layout.endswith("_tied"):  # the one-process runs of the tied model
        ref = train_with_masters(tmp_path / "master", *TIED, *MASTER)
        fp32 = train_with_masters(tmp_path / "fp32", *TIED)
    ranks = run_distributed(_rank, world, str(tmp_path / "run"), overrides, timeout=600)
    run = ranks[0]
    for step, (a, b, c) in enumerate(zip(run["losses"], ref["losses"], fp32["losses"], strict=True)):
        assert abs(a - b) <= LOSS_RTOL * abs(b), f"{layout} step {step}: loss {a} vs one-process master {b}"
        assert abs(a - c) <= FP32_RTOL * abs(c), f"{layout} step {step}: loss {a} vs one-process fp32 {c}"
    assert run["master"].keys() == ref["master"].keys()
    worst = max(float(abs(run["master"][n] - ref["master"][n]).max()) for n in ref["master"])
    move = max(float(abs(ref["master"][n] - ref["initial"][n]).max()) for n in ref["master"])
    assert worst <= MASTER_OF_MOVE * move, f"{layout}: master weights differ by {worst}, training moved them {move}"
    fsdp = {"language"} if layout == "fsdp2" else set()
    for rank, (r, share) in enumerate(zip(ranks, SHARES[layout], strict=True)):
        assert {name for name, _ in r["shards"]} == set(share), rank
        assert all(frac == share[name] for name, frac in r["shards"]), (rank, r["shards"])
        assert r["fsdp"].keys() == fsdp, rank
        for name, (local, full, dtypes) in r["fsdp"].items():  # fp32 shards of the weights and moments
            assert sum(o["fsdp"][name][0] for o in ranks) == full and local < full, (rank, name)
            assert dtypes == {"torch.float32"}, (rank, name, dtypes)


def _skip_rank(rank: int, world: int, out: str, layout: list[str]) -> dict:
    """Four steps; in step 1 the encoder stage (rank 0) alone finds an infinite gradient after its reduction.
    Per step: whether it stepped, and this rank's fp32 master state and bf16 weights (as numpy)."""
    trainer = Trainer(tiny_config(Path(out), *MODEL, *layout, *MASTER))
    calls, finalize = [], trainer.plan.finalize_grads

    def poisoned(model) -> None:
        finalize(model)
        if rank == 0 and len(calls) == 1:
            trainer.optimizer.params[0].grad.fill_(float("inf"))
        calls.append(1)

    trainer.plan.finalize_grads = poisoned
    stepped, state = [], []
    for step in range(4):
        stepped.append(trainer.train_step(step)["stepped"])
        tensors = [opt.master for _, opt in trainer.optimizer.parts] + list(trainer.model.parameters())
        state.append([t.detach().float().numpy().copy() for t in tensors])
    return {"stepped": stepped, "state": state}


@pytest.mark.slow
def test_a_non_finite_gradient_on_one_stage_skips_the_step_on_every_stage(tmp_path):
    """The global norm adds every stage's share, so an infinite gradient on the encoder stage skips the step on
    the LM's stages too: no rank's master state or weights move in it, and training goes on after."""
    world, overrides = LAYOUTS["pipeline3"]
    ranks = run_distributed(_skip_rank, world, str(tmp_path), overrides, timeout=600)
    for rank, r in enumerate(ranks):
        assert r["stepped"] == [True, False, True, True], rank
        unchanged = [np.array_equal(a, b) for a, b in zip(r["state"][0], r["state"][1], strict=True)]
        moved = [np.array_equal(a, b) for a, b in zip(r["state"][1], r["state"][2], strict=True)]
        assert all(unchanged) and not any(moved[:1]), (rank, unchanged, moved)


ALL_FAST = ["--perf.loss_rows_only=true", "--perf.chunked_loss=true", "--perf.fuse_qkv=true",
            '--perf.activation_checkpointing=["language", "images"]', "--perf.compile=true",
            "--perf.compile_backend=aot_eager"]


def _all_fast_rank(rank: int, world: int, out: str, layout: list[str]) -> tuple[list[float], bool]:
    """The losses, and whether this rank runs the chunked loss and fused q/k/v in every block it holds."""
    trainer = Trainer(tiny_config(Path(out), *MODEL, *layout, *MASTER, *ALL_FAST))
    held = [m for m in trainer.model.modules() if isinstance(m, SelfAttention) and m.q_proj.weight is not None]
    installed = isinstance(trainer.model.runtime.loss_fn, ChunkedLMLoss) and all(m.fused_qkv for m in held)
    return [trainer.train_step(step)["loss"] for step in range(STEPS)], installed and bool(held)


@pytest.mark.slow
def test_master_weights_with_every_fast_path_on_the_pipeline_stay_within_the_loss_check(tmp_path, references):
    """What the GPU defaults turn on for the pipeline (master weights, the labelled rows, the chunked loss,
    fused q/k/v; with checkpointing and compiled blocks) against the one-process fp32 run."""
    _, fp32 = references
    world, overrides = LAYOUTS["pipeline3"]
    ranks = run_distributed(_all_fast_rank, world, str(tmp_path), overrides, timeout=600)
    assert all(installed for _, installed in ranks), ranks
    losses = ranks[0][0]
    for step, (a, c) in enumerate(zip(losses, fp32["losses"], strict=True)):
        assert abs(a - c) <= FP32_RTOL * abs(c), f"step {step}: loss {a} vs one-process fp32 {c}"
