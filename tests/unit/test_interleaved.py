"""Interleaved 1F1B (`parallel.modules.language.virtual_stages`) in one process: chunks are strided, the
schedule has the bubble the hand formula gives, an encoder pipeline feeding it cannot deadlock, and the gate
refuses bad virtual stages."""

import pytest

from mimo.config.schema import ConfigError, ModuleLayoutConfig
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from mimo.parallel.pipeline.schedule import feeder_lead, interleaved_order, run_1f1b
from mimo.parallel.pipeline.split import chunk_layers
from mimo.planner.simulate import interleaved_ops, one_f_one_b_ops, schedule_bubble, simulate
from tests.support.interleaved_case import interleaved_config


def test_chunks_are_strided_and_keep_global_layer_keys():
    assert chunk_layers(4, 2, 0, 2) == [["0"], ["2"]] and chunk_layers(4, 2, 1, 2) == [["1"], ["3"]]
    assert chunk_layers(6, 3, 2, 2) == [["2"], ["5"]]
    assert chunk_layers(8, 2, 1, 2) == [["2", "3"], ["6", "7"]]
    with pytest.raises(ValueError, match="5 layers cannot fill 3 pipeline stages x 2 virtual stages"):
        chunk_layers(5, 3, 0, 2)


@pytest.mark.parametrize("pp,chunks,micro", [(2, 2, 4), (3, 2, 6), (4, 2, 8), (2, 4, 2), (3, 3, 3)])
def test_bubble_of_the_runtime_schedule_matches_the_hand_formula(pp, chunks, micro):
    """Equal stage costs: idle / busy = (pp - 1) / m under 1F1B, (pp - 1) / (v m) interleaved."""
    idle, busy = schedule_bubble(pp, 1, micro)
    assert idle / busy == pytest.approx((pp - 1) / micro)
    idle, busy = schedule_bubble(pp, chunks, micro)
    assert idle / busy == pytest.approx((pp - 1) / (chunks * micro))
    for r in range(pp):  # each rank runs each of its chunks' forward and backward once per microbatch
        order = interleaved_order(r, pp, chunks, micro)
        assert sorted(order) == sorted((k, t, c) for k in "FB" for t in range(micro) for c in range(chunks))


def _plain_1f1b(stage: int, micro: int, warmup: int) -> list[tuple[str, int, int]]:
    """The ops `run_1f1b` runs on DAG stage `stage` with `warmup`."""
    ops, flight = [], []

    class Recorder:
        def forward(self, t: int) -> None:
            ops.append(("F", t, stage))
            flight.append(t)

        def backward(self) -> None:
            ops.append(("B", flight.pop(0), stage))

    run_1f1b(Recorder(), micro, warmup)
    return ops


@pytest.mark.parametrize("depth,pp,chunks,micro", [(1, 2, 2, 4), (2, 3, 2, 3), (1, 2, 3, 2), (2, 2, 2, 6)])
def test_an_encoder_pipeline_feeding_an_interleaved_lm_cannot_deadlock(depth, pp, chunks, micro):
    """The encoder's stages (plain 1F1B) warm up by `feeder_lead` of the LM's first rank, as
    `PipelinePlan` runs them; on the clock (sends never block, receives wait) every rank finishes."""
    assert feeder_lead(one_f_one_b_ops(0, pp, micro)) == pp  # a plain LM: the stage before it warms up pp
    lead = feeder_lead(interleaved_order(0, pp, chunks, micro))
    ops = [_plain_1f1b(s, micro, min(lead + depth - 1 - s, micro)) for s in range(depth)]
    ops += [[(k, t, depth + v) for k, t, v in interleaved_ops(r, pp, chunks, micro)] for r in range(pp)]
    vstages = depth + pp * chunks
    cost = dict.fromkeys(range(vstages), 1.0)
    timeline = simulate(ops, {v: [v - 1] if v else [] for v in range(vstages)}, cost, cost)
    assert timeline.makespan >= 2 * micro * chunks


@pytest.mark.parametrize("change,message", [
    (lambda c: (setattr(c.parallel, "microbatches", 3), setattr(c.data, "global_batch", 6)),
     r"parallel.microbatches \(3\) must be a multiple of parallel.modules.language.pp \(2\); use microbatches = 4"),
    (lambda c: setattr(c.model.llm, "layers", 3), r"cuts model.llm.layers \(3\) into pp x virtual_stages = 4"),
    (lambda c: setattr(c.parallel.modules["images"], "virtual_stages", 2), "language model's pipeline only"),
    (lambda c: setattr(c.parallel.modules["language"], "virtual_stages", 0), "virtual_stages = 0 must be >= 1"),
    (lambda c: c.parallel.modules.update(language=ModuleLayoutConfig(offset=1, size=2, virtual_stages=2)),
     r"the LM is not pipelined \(pp = 1\)"),
])
def test_bad_virtual_stages_are_refused_by_the_gate(change, message):
    cfg = interleaved_config(2, 4, False)
    change(cfg)
    layout = Layout.from_config(cfg.parallel.modules, ["language", "images"], 3)
    with pytest.raises(ConfigError, match=message):
        validate_plan(cfg, layout)
