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

With `parallel.modules.language.virtual_stages` > 1 the LM's ranks instead run Megatron's interleaved
order over their model chunks (`interleaved_order`, `run_interleaved`); encoder stages keep plain 1F1B
with the warm-up the interleaved LM's first rank needs of its feeder (`feeder_lead`).
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


Op = tuple[str, int, int]
"""("F" or "B", microbatch, model chunk) in one rank's interleaved order."""


class ChunkedStage(Protocol):
    def forward(self, t: int, chunk: int) -> None: ...

    def backward(self, chunk: int) -> None: ...


def interleaved_order(rank: int, pp: int, chunks: int, microbatches: int) -> list[Op]:
    """Megatron's interleaved 1F1B for `rank` of `pp` ranks, each holding `chunks` model chunks (chunk k of
    rank r is virtual stage k * pp + r). Microbatches go in groups of pp: forwards run group by group over
    chunks 0..chunks-1, backwards the same groups over chunks-1..0; warm-up = 2 (pp - rank - 1) +
    (chunks - 1) pp forwards, then steady 1F1B, then cool-down. Every rank's order visits the virtual
    microbatches in the same sequence, so a link's messages arrive in the order they are received.
    Needs microbatches divisible by pp."""
    if microbatches % pp:
        raise ValueError(f"the interleaved schedule needs microbatches ({microbatches}) divisible by pp ({pp})")
    total = microbatches * chunks
    warmup = min((pp - rank - 1) * 2 + (chunks - 1) * pp, total)

    def op(kind: str, k: int) -> Op:
        chunk = (k // pp) % chunks
        return kind, (k // (pp * chunks)) * pp + k % pp, chunks - 1 - chunk if kind == "B" else chunk

    ops = [op("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        ops += [op("F", warmup + i), op("B", i)]
    return ops + [op("B", k) for k in range(total - warmup, total)]


def feeder_lead(order: list[Op]) -> int:
    """The warm-up of a plain 1F1B stage feeding chunk 0 of `order` (an encoder's last stage before an
    interleaved LM): the most chunk-0 forwards `order` runs before its chunk-0 backward of microbatch j,
    less j. The feeder then has sent every input the LM needs before it waits for a gradient, and stays a
    microbatch ahead; for a plain 1F1B LM of pp stages this is pp, as `warmup_microbatches` gives."""
    forwards, lead = 0, 0
    for kind, t, chunk in order:
        if chunk != 0:
            continue
        if kind == "F":
            forwards += 1
        else:
            lead = max(lead, forwards - t)
    return lead


def run_interleaved(stage: ChunkedStage, order: list[Op]) -> None:
    """Drive one step of a rank's model chunks through `order` (`interleaved_order`)."""
    for kind, t, chunk in order:
        if kind == "F":
            stage.forward(t, chunk)
        else:
            stage.backward(chunk)
