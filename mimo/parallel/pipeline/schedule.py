"""The multi-module 1F1B schedule (SPEC 3.3) over the module DAG encoders -> LM.

Stages are numbered along the DAG: an encoder's pipeline stage p is stage p, the LM's stage p is
stage D + p where D is the deepest encoder pipeline; total = D + LM pp (the longest PP-weighted
path). Every rank runs the same three phases over M microbatches:

    warm-up   = min(total - stage - 1, M) forwards
    steady    = (M - warm-up) x (one forward, then the backward of the oldest microbatch in flight)
    cool-down = warm-up backwards

so the last stage alternates from the start and every earlier stage runs just far enough ahead to
keep the pipeline full. An encoder shallower than the deepest one simply runs further ahead.
Sends never block (see mimo.parallel.p2p), so each rank only waits on data its peers produce earlier in
this order, and the schedule cannot deadlock.
"""

from __future__ import annotations

from typing import Protocol


class Stage(Protocol):
    def forward(self, t: int) -> None: ...

    def backward(self) -> None: ...


def stage_index(module_pp_rank: int, is_language: bool, encoder_depth: int) -> int:
    """A rank's stage in the module DAG (encoders first, then the LM)."""
    return encoder_depth + module_pp_rank if is_language else module_pp_rank


def warmup_microbatches(total_stages: int, stage: int, microbatches: int) -> int:
    if not 0 <= stage < total_stages:
        raise ValueError(f"stage {stage} is outside a pipeline of {total_stages} stages")
    return min(total_stages - stage - 1, microbatches)


def run_1f1b(stage: Stage, microbatches: int, warmup: int) -> None:
    """Drive one step of `stage` through warm-up, steady 1F1B and cool-down."""
    if not 0 <= warmup <= microbatches:
        raise ValueError(f"warm-up {warmup} must lie in [0, {microbatches}] microbatches")
    for t in range(warmup):
        stage.forward(t)
    for t in range(warmup, microbatches):
        stage.forward(t)
        stage.backward()
    for _ in range(warmup):
        stage.backward()


def run_forwards(stage: Stage, microbatches: int) -> None:
    """Drive the forwards of one evaluation pass of `stage`, in order (no backward; sends never block, so
    every stage runs ahead as far as its inputs allow)."""
    for t in range(microbatches):
        stage.forward(t)
