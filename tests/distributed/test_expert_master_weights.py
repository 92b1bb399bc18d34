"""`precision.master_weights` beside expert parallelism trains like the single-process master_weights run of the
same MoE model, within the bf16 bounds of tests/distributed/test_master_weights_layouts.py:
- LM ep2 with FSDP2 (its fp32 shards, experts over their edp ranks, are the master weights);
- a replicated LM (no FSDP), ep2 on 2 ranks (edp 1) and ep2 x dp2 on 4 ranks (edp 2): ZeRO-1 master state of
  the dense parameters sharded over all the LM's lanes, that of the experts over their edp group only. Each
  rank's parts then hold 1/dp of the dense buffers and 1/edp of the expert buffers (hand values below)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.dist import run_distributed
from tests.support.master_weights import EP_FSDP, LANG, LOSS_RTOL, MASTER, MASTER_OF_MOVE, MOE, train_with_masters

# world, layout, and the shard fractions (dense LM parts, expert parts) of each rank's master state.
REPLICATED = {"ep2": (2, [f"{LANG}.ep=2"], 1 / 2, 1.0), "ep2_dp2": (4, [f"{LANG}.ep=2"], 1 / 4, 1 / 2)}


def _rank(rank: int, world: int, out: str, layout: list[str]) -> dict:
    return train_with_masters(Path(out), *MOE, *layout, *MASTER)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return train_with_masters(tmp_path_factory.mktemp("ref"), *MOE, *MASTER)


def _assert_close(run: dict, ref: dict, what: str) -> None:
    for step, (a, b) in enumerate(zip(run["losses"], ref["losses"], strict=True)):
        assert abs(a - b) <= LOSS_RTOL * abs(b), f"{what} step {step}: loss {a} vs one-process master {b}"
    assert run["master"].keys() == ref["master"].keys()
    worst = max(float(abs(run["master"][n] - ref["master"][n]).max()) for n in ref["master"])
    move = max(float(abs(ref["master"][n] - ref["initial"][n]).max()) for n in ref["master"])
    assert worst <= MASTER_OF_MOVE * move, f"{what}: master weights differ by {worst}, training moved them {move}"


def test_master_weights_train_under_expert_parallel_fsdp(tmp_path, reference):
    run = run_distributed(_rank, 2, str(tmp_path / "ep"), EP_FSDP, timeout=600)[0]
    _assert_close(run, reference, "ep2 fsdp")
    assert set(run["fsdp"]) == {"language"}


@pytest.mark.parametrize("layout", sorted(REPLICATED))
def test_master_weights_shard_experts_over_their_edp_group(tmp_path, reference, layout):
    world, overrides, dense, expert = REPLICATED[layout]
    ranks = run_distributed(_rank, world, str(tmp_path / layout), overrides, timeout=600)
    _assert_close(ranks[0], reference, layout)
    for rank, r in enumerate(ranks):
        lm = [frac for name, frac in r["shards"] if name == "language"]
        assert sorted(set(lm)) == sorted({dense, expert}), (rank, r["shards"])
        assert r["fsdp"] == {}, rank
