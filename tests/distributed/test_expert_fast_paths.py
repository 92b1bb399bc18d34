"""The fast paths of `mimo train` beside expert parallelism: on LM ep2 over 2 ranks (and ep2 with FSDP2), a MoE
VLM with `perf.activation_checkpointing`, `perf.fuse_qkv`, `perf.chunked_loss` and `perf.compile` (aot_eager)
all on trains like the single-process plain fp32 run: both steps' losses and every gradient within 1e-5 relative.
A checkpointed block's recompute runs its all-to-alls again inside the backward, in the same order on every rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.dist import run_distributed
from tests.support.fast_path_runs import LANG, RTOL, SWITCHES, assert_trains_like_reference, train_tiny

MOE = ["--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_top_k=2",
       "--model.llm.moe_aux_loss_weight=0.01"]
ALL = [s for switches in SWITCHES.values() for s in switches]
LAYOUTS = {"ep2": [f"{LANG}.ep=2"], "ep2_fsdp": [f"{LANG}.ep=2", f"{LANG}.fsdp=true"]}


def _rank(rank: int, world: int, out: str, layout: list[str]) -> tuple:
    losses, grads, paths = train_tiny(Path(out), *MOE, *layout, *ALL)
    return losses, [{n: g.numpy() for n, g in step.items()} for step in grads], paths


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fast_paths_train_like_one_process_under_expert_parallel(tmp_path, layout):
    threads = torch.get_num_threads()
    ref_losses, ref_grads, _ = train_tiny(tmp_path / "plain", *MOE)
    torch.set_num_threads(threads)
    ranks = run_distributed(_rank, 2, str(tmp_path / layout), LAYOUTS[layout], timeout=900)
    losses, grads, _ = ranks[0]
    grads = [{n: torch.from_numpy(g) for n, g in step.items()} for step in grads]
    for rank, (_, _, paths) in enumerate(ranks):
        assert paths["graphs"] > 0 and paths["chunked_loss"] and paths["fused"] and paths["checkpointed"], (rank, paths)
    assert_trains_like_reference(f"{layout} all fast paths (rtol {RTOL})", (losses, grads), (ref_losses, ref_grads))
