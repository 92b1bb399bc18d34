"""Every fast path of `mimo train`, alone and all together, on five layouts, trains like the single-process
plain fp32 run of the same config: `perf.compile`, `perf.chunked_loss` (vocab-parallel under LM TP),
`perf.fuse_qkv` (each rank's own q/k/v shards under TP) and `perf.activation_checkpointing` of both modules,
on LM tp2 + sequence parallel (encoder tp2), LM cp2 x tp2 + sequence parallel (encoder tp2), FSDP2 of both
modules over 2 ranks, the colocated fan-in on 4 ranks (encoder dp4 into LM tp2 x dp2) and the 3-rank pipeline
(encoder on rank 0, LM pp2 on ranks 1-2). Each run is a `Trainer` built from the config, as `mimo train` builds
it; two steps each: both losses and every gradient of both steps (gathered whole) within 1e-5 relative.
`perf.loss_rows_only` likewise on every layout, on LM cp2 x tp2 without sequence parallel and on the pipeline
with LM cp2 or LM tp2 + sequence parallel.

Compiled runs use `perf.compile_backend = "aot_eager"`: Dynamo captures each block with its collectives (as
functional collectives) and AOTAutograd traces its joint forward and backward, functionalises the in-place
collectives, partitions the graph and traces the checkpointed recompute, exactly as for inductor; only the
kernels are eager. Inductor's C++ code generation, minutes per layout on this 2-core machine, adds fused
kernels but no tracing around collectives; it is covered once, on TP2 + sequence parallel
(`test_inductor_compiles_tensor_parallel_blocks`), and on GPUs by tests/gpu/test_fast_paths_gpu.py. Every rank
compiles each block kind once per run (identical blocks share a graph); the tiny model keeps that to seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.dist import run_distributed
from tests.support.fast_path_runs import IMG, LANG, LAYOUTS, SWITCHES, assert_trains_like_reference, train_tiny

ROWS_ONLY_LAYOUTS = {
    "cp2_tp2_no_sp": (4, [f"{LANG}.cp=2", f"{LANG}.tp=2", f"{IMG}.tp=2"]),
    "pipeline_cp2": (3, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.cp=2"]),
    "pipeline_tp2_sp": (3, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.tp=2",
                            f"{LANG}.sequence_parallel=true"]),
}
"""Layouts only the loss_rows_only test runs: CP without sequence parallel, and CP or sequence parallel on a
pipeline (encoder on rank 0, LM on ranks 1-2)."""
VARIANTS = {**SWITCHES, "all": [s for switches in SWITCHES.values() for s in switches]}


def _variants(rank: int, world: int, out: str, layout: list[str], variants: dict[str, list[str]]) -> dict:
    """Every variant on one layout in one spawn of the ranks: per variant, what each rank installed, and on
    rank 0 the losses and gradients, as numpy arrays (a tensor would travel as shared memory that dies with
    the rank)."""
    results = {}
    for name, switches in variants.items():
        losses, grads, paths = train_tiny(Path(out) / name, *layout, *switches)
        results[name] = losses, [{n: g.numpy() for n, g in step.items()} for step in grads], paths
    return results


def _run(tmp_path: Path, layout: str, variants: dict[str, list[str]]) -> dict:
    """variant -> (losses, gradients per step, [what each rank installed])."""
    world, overrides = {**LAYOUTS, **ROWS_ONLY_LAYOUTS}[layout]
    ranks = run_distributed(_variants, world, str(tmp_path), overrides, variants, timeout=900)
    return {name: (losses, [{n: torch.from_numpy(g) for n, g in step.items()} for step in grads],
                   [r[name][2] for r in ranks]) for name, (losses, grads, _) in ranks[0].items()}


def _assert_installed(what: str, switches: list[str], ranks: list[dict]) -> None:
    """Each switch asked for runs on every rank: compiled blocks without a graph break, the chunked loss,
    fused and checkpointed blocks wherever the rank holds attention blocks (every rank here)."""
    for rank, paths in enumerate(ranks):
        where = f"{what} rank {rank}: {paths}"
        assert (paths["graphs"] > 0 and not paths["graph_breaks"]) == any("compile=" in s for s in switches), where
        assert paths["chunked_loss"] == any("chunked_loss" in s for s in switches), where
        assert (paths["fused"] > 0) == any("fuse_qkv" in s for s in switches), where
        assert (paths["checkpointed"] > 0) == any("checkpointing" in s for s in switches), where


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    threads = torch.get_num_threads()
    losses, grads, _ = train_tiny(tmp_path_factory.mktemp("plain"))
    yield losses, grads
    torch.set_num_threads(threads)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fast_paths_train_like_single_process(reference, tmp_path, layout):
    results = _run(tmp_path, layout, VARIANTS)
    assert results.keys() == VARIANTS.keys()
    for name, (losses, grads, ranks) in results.items():
        _assert_installed(f"{layout} {name}", VARIANTS[name], ranks)
        assert_trains_like_reference(f"{layout} {name}", (losses, grads), reference)


def test_inductor_compiles_tensor_parallel_blocks(reference, tmp_path):
    """Inductor's kernels around the functional collectives of a TP2 + sequence-parallel block, all fast
    paths on (inductor reorders fp32 sums, within the same 1e-5)."""
    switches = [s for s in VARIANTS["all"] if "compile_backend" not in s]
    losses, grads, ranks = _run(tmp_path, "tp2_sp", {"inductor": switches})["inductor"]
    _assert_installed("tp2_sp inductor", switches, ranks)
    assert_trains_like_reference("tp2_sp inductor", (losses, grads), reference)


@pytest.mark.parametrize("layout", ["tp2_sp", "cp2_tp2", "cp2_tp2_no_sp", "fsdp2", "fan_in4", "pipeline3",
                                    "pipeline_cp2", "pipeline_tp2_sp"])
def test_loss_rows_only_trains_like_single_process(reference, tmp_path, layout):
    """`perf.loss_rows_only` (with the chunked loss, vocab-parallel where the LM has tp2) on LM tp2 + sequence
    parallel (each TP rank's rows of its own shard, padded with unlabelled ones to the group's largest count),
    LM cp2 x tp2 with and without it (each CP rank's rows among its own zigzag positions, which `shard_batch` cut; a
    rank may hold none), FSDP2, the fan-in and the pipelines (the LM's last stage finds the rows in the labels it
    reads, after CP cut them)."""
    variants = {"loss_rows_only": ["--perf.loss_rows_only=true", "--perf.chunked_loss=true"]}
    if layout in ("fsdp2", "pipeline3", "pipeline_cp2"):  # and the plain loss where the LM has no TP
        variants["plain_loss"] = ["--perf.loss_rows_only=true"]
    for name, (losses, grads, ranks) in _run(tmp_path, layout, variants).items():
        _assert_installed(f"{layout} {name}", variants[name], ranks)
        assert_trains_like_reference(f"{layout} {name}", (losses, grads), reference)
