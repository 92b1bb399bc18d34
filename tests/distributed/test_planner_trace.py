"""The planner's simulated pipeline against a traced one: 4 gloo ranks (encoder on rank 0, the LM in 3 stages on
ranks 1-3), 4 microbatches. Each rank records the forwards and backwards its stage runs and when each ends;
the order on every rank must be the simulator's, and no traced op may end before the op the simulator makes it
wait for has started (its predecessor's forward, its successor's backward: the message is sent inside that op).
A microbatch without images sends the encoder no gradient (`recv_like` skips empty buffers), so the encoder's
backward of it waits for nothing and is not checked against the LM's.
The simulator waits for that op's end: a stage sends its input gradient before its own weight gradients are
done, so the simulated wait is an upper bound by that tail."""

from __future__ import annotations

import contextlib
import time
from collections import deque

import torch

from mimo.models.build import build_model
from mimo.parallel.pipeline import stage as stage_module
from mimo.parallel.plan import ParallelPlan
from mimo.planner.simulate import one_f_one_b_ops
from tests.support.dist import rank_device, run_distributed
from tests.support.pipeline_case import IMAGES_PER_SAMPLE, PER_MB, pipeline_batch, pipeline_config

WORLD, MICRO = 4, 4


def _traced_step(rank: int, world: int) -> list[tuple[str, int, float, float]]:
    """This rank's (kind, microbatch, start, end) of one training step, in the order they ran."""
    trace: list[tuple[str, int, float, float]] = []
    pending: deque[int] = deque()
    for cls in (stage_module.EncoderStage, stage_module.LMStage):
        forward, backward = cls.forward, cls.backward

        def traced_forward(self, t, forward=forward):
            start = time.perf_counter()
            forward(self, t)
            pending.append(t)
            trace.append(("F", t, start, time.perf_counter()))

        def traced_backward(self, backward=backward):
            start = time.perf_counter()
            backward(self)
            trace.append(("B", pending.popleft(), start, time.perf_counter()))

        cls.forward, cls.backward = traced_forward, traced_backward
    cfg = pipeline_config((1, 1, 1), (1, 3, 1), False)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(model)
    pipe = plan.pipeline
    pipe.train_step(model, pipeline_batch() if pipe.needs_data else None, rank_device(), contextlib.nullcontext)
    return trace


def test_simulated_1f1b_is_the_traced_one():
    traces = run_distributed(_traced_step, WORLD, timeout=300)
    assert [len(t) for t in traces] == [2 * MICRO] * WORLD
    for stage, trace in enumerate(traces):  # rank r runs DAG stage r: the encoder, then the LM's three
        assert [(k, t) for k, t, *_ in trace] == [(k, t) for k, t, _ in one_f_one_b_ops(stage, WORLD, MICRO)]
    start = {(k, t, s): a for s, trace in enumerate(traces) for k, t, a, _ in trace}
    end = {(k, t, s): b for s, trace in enumerate(traces) for k, t, _, b in trace}
    imageless = {t for t in range(MICRO) if not any(IMAGES_PER_SAMPLE[t * PER_MB:(t + 1) * PER_MB])}
    for (kind, t, s), at in end.items():
        if kind == "F" and s > 0:
            assert at >= start["F", t, s - 1], f"stage {s} finished forward {t} before stage {s - 1} began it"
        if kind == "B" and s < WORLD - 1 and not (s == 0 and t in imageless):
            assert at >= start["B", t, s + 1], f"stage {s} finished backward {t} before stage {s + 1} began it"
        if kind == "B" and s == WORLD - 1:
            assert start["B", t, s] >= end["F", t, s]
