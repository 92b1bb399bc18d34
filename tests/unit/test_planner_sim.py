"""The planner's step simulator and communication model against hand-computed schedules and formulas."""

from __future__ import annotations

import pytest

from mimo.planner.calibrate import fit_line
from mimo.planner.network import Network
from mimo.planner.simulate import colocated_pipeline_ops, interleaved_ops, one_f_one_b_ops, simulate


def _chain(p: int) -> dict[int, list[int]]:
    return {v: [v - 1] if v else [] for v in range(p)}


def _one_f_one_b(p: int, micro: int, f: float, b: float, send: float = 0.0):
    ops = [one_f_one_b_ops(s, p, micro) for s in range(p)]
    return simulate(ops, _chain(p), dict.fromkeys(range(p), f), dict.fromkeys(range(p), b),
                    dict.fromkeys(range(p), send))


@pytest.mark.parametrize("p,micro", [(2, 4), (2, 8), (4, 4), (4, 8), (4, 2)])
def test_1f1b_step_and_bubble_follow_the_formula(p, micro):
    """Uniform stages, free sends: step = (M + p - 1)(f + b); every stage idles (p - 1)(f + b)."""
    f, b = 1.0, 2.0
    t = _one_f_one_b(p, micro, f, b)
    assert t.makespan == pytest.approx((micro + p - 1) * (f + b))
    for s in range(p):
        assert t.bubble(s) == pytest.approx((p - 1) * (f + b))


def test_1f1b_order_is_mimos_schedule():
    """Stage 0 of 4 over 6 microbatches: 3 warm-up forwards, 1F1B, 3 cool-down backwards, oldest first."""
    ops = [(k, t) for k, t, _ in one_f_one_b_ops(0, 4, 6)]
    assert ops == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1), ("F", 5), ("B", 2),
                   ("B", 3), ("B", 4), ("B", 5)]
    assert [k for k, _, _ in one_f_one_b_ops(3, 4, 6)] == ["F", "B"] * 6  # the last stage alternates at once


def test_sends_add_to_the_critical_path():
    """Two stages, one microbatch: F0, send, F1, B1, send back, B0."""
    t = _one_f_one_b(2, 1, 1.0, 2.0, send=0.25)
    assert t.makespan == pytest.approx(1 + 0.25 + 1 + 2 + 0.25 + 2)
    ((op, start, end),) = [e for e in t.events[1] if e[0][0] == "F"]
    assert (start, end) == (pytest.approx(1.25), pytest.approx(2.25))


@pytest.mark.parametrize("p,chunks,micro", [(2, 2, 4), (4, 2, 8), (2, 4, 4), (4, 4, 8)])
def test_interleaved_bubble_shrinks_by_the_chunks(p, chunks, micro):
    """Megatron's interleaved 1F1B, chunk times f/v and b/v with f = b: step = M (f + b) + (p - 1)(f + b) / v."""
    f = b = 1.0
    vstages = p * chunks
    ops = [interleaved_ops(r, p, chunks, micro) for r in range(p)]
    for r, rank_ops in enumerate(ops):  # every rank runs each of its chunks' forward and backward once per microbatch
        assert sorted(rank_ops) == sorted((k, t, c * p + r) for k in "FB" for t in range(micro) for c in range(chunks))
    t = simulate(ops, _chain(vstages), dict.fromkeys(range(vstages), f / chunks),
                 dict.fromkeys(range(vstages), b / chunks))
    assert t.makespan == pytest.approx(micro * (f + b) + (p - 1) * (f + b) / chunks)
    plain = _one_f_one_b(p, micro, f, b)
    assert t.makespan < plain.makespan


def test_multi_module_dag_waits_for_every_encoder():
    """Two one-stage encoders (0: 1 s, 1: 3 s forward) feed a one-stage LM: its forward waits for the slower."""
    preds = {0: [], 1: [], 2: [0, 1]}
    ops = [one_f_one_b_ops(0, 2, 1), one_f_one_b_ops(0, 2, 1), one_f_one_b_ops(1, 2, 1)]
    ops = [[(k, t, v) for k, t, _ in rank] for v, rank in enumerate(ops)]
    t = simulate(ops, preds, {0: 1.0, 1: 3.0, 2: 2.0}, {0: 2.0, 1: 6.0, 2: 4.0})
    assert t.makespan == pytest.approx(3 + 2 + 4 + 6)
    assert t.bubble(0) == pytest.approx(15 - 3)


def test_an_order_that_cannot_finish_is_refused():
    ops = [[("B", 0, 0), ("F", 0, 0)], [("F", 0, 1), ("B", 0, 1)]]
    with pytest.raises(ValueError, match="cannot finish"):
        simulate(ops, _chain(2), {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0})


def test_interleaved_needs_microbatches_divisible_by_pp():
    with pytest.raises(ValueError, match="divisible by pp"):
        interleaved_ops(0, 4, 2, 6)


def test_collectives_by_hand():
    net = Network(nvlink_gbps=400, nvlink_latency_s=1e-5, network_gbps=50, network_latency_s=2e-5, gpus_per_node=8)
    gb = 1e9
    assert net.all_reduce(gb, 0, 1, 8) == pytest.approx(2 * 7 / 8 * gb / 400e9 + 14 * 1e-5)
    assert net.all_gather(gb, 0, 1, 4) == pytest.approx(3 / 4 * gb / 400e9 + 3 * 1e-5)
    # dp ranks 8 apart (tp8 inside each node): the group spans 4 nodes and runs at the network's figures
    assert net.spans_nodes(0, 8, 4) and not net.spans_nodes(8, 1, 8)
    assert net.all_reduce(gb, 0, 8, 4) == pytest.approx(2 * 3 / 4 * gb / 50e9 + 6 * 2e-5)
    assert net.send(gb, 7, 8) == pytest.approx(gb / 50e9 + 2e-5)
    assert net.send(gb, 0, 1) == pytest.approx(gb / 400e9 + 1e-5)
    assert net.all_reduce(gb, 0, 1, 1) == 0.0 and net.send(gb, 3, 3) == 0.0


def test_fit_line_recovers_a_line():
    work = [1e9, 4e9, 1.6e10, 6.4e10]
    seconds = [5e-6 + w / 7e14 for w in work]
    fixed, rate = fit_line(work, seconds)
    assert fixed == pytest.approx(5e-6, rel=1e-6) and rate == pytest.approx(7e14, rel=1e-6)


def test_two_stage_pipeline_with_a_slow_last_stage():
    """Encoder (fe, be) feeding a slower LM (fl, bl), sends c: the LM never stalls once it starts, so the step
    is fe + c + M (fl + bl) + c + be (holds while fl + bl >= fe + be + 2c)."""
    fe, be, fl, bl, c, micro = 0.5, 1.0, 2.0, 3.0, 0.1, 6
    ops = [one_f_one_b_ops(s, 2, micro) for s in range(2)]
    t = simulate(ops, _chain(2), {0: fe, 1: fl}, {0: be, 1: bl}, {0: c, 1: 0.0})
    assert t.makespan == pytest.approx(fe + c + micro * (fl + bl) + c + be)
    assert t.bubble(1) == pytest.approx(fe + be + 2 * c)


def _colocated_pipeline(offload: bool = False):
    """pp2, 4 microbatches: encoder forward 1, backward 2; each LM stage forward 2, backward 4; free sends;
    both collectives 1; host copies 3."""
    ops, preds = colocated_pipeline_ops(2, 1, 4, offload)
    times = {0: (2.0, 4.0), 1: (2.0, 4.0), 2: (1.0, 2.0), 3: (1.0, 2.0)}  # LM stages 0, 1; rank 0's, rank 1's encoders
    fixed = {("C", 0): 1.0, ("C", 1): 1.0, ("H", 0): 3.0, ("H", 1): 3.0}
    return simulate(ops, preds, {v: f for v, (f, _) in times.items()}, {v: b for v, (_, b) in times.items()},
                    fixed_s=fixed)


def test_a_colocated_pipeline_step_by_hand():
    """Counted by hand, (start, end) of each op:
    phase 1, both ranks: encoder F0..F3 at 0-1, 1-2, 2-3, 3-4; collective 0 at 4-5.
    phase 2, 1F1B (stage 0: F0 F1 B0 F2 B1 F3 B2 B3; stage 1: F0 B0 F1 B1 F2 B2 F3 B3):
      stage 0: F0 5-7, F1 7-9, (idle 9-13), B0 13-17, F2 17-19, B1 19-23, F3 23-25, B2 25-29, (idle 29-31), B3 31-35
      stage 1: (idle 5-7), F0 7-9, B0 9-13, F1 13-15, B1 15-19, F2 19-21, B2 21-25, F3 25-27, B3 27-31, (idle 31-35)
    collective 1 waits for stage 0: 35-36; phase 3, both ranks: encoder B0..B3 at 36-38, 38-40, 40-42, 42-44.
    Step 44 s; each rank busy 4 + 1 + 4 x 6 + 1 + 8 = 38 s, idle 6 = (pp - 1)(f + b) of the LM."""
    t = _colocated_pipeline()
    assert t.makespan == pytest.approx(44.0)
    stage0 = [(op, s, e) for op, s, e in t.events[0]]
    expected0 = ([(("F", i, 2), i, i + 1) for i in range(4)] + [(("C", 0, -1), 4, 5)]
                 + [(("F", 0, 0), 5, 7), (("F", 1, 0), 7, 9), (("B", 0, 0), 13, 17), (("F", 2, 0), 17, 19),
                    (("B", 1, 0), 19, 23), (("F", 3, 0), 23, 25), (("B", 2, 0), 25, 29), (("B", 3, 0), 31, 35)]
                 + [(("C", 1, -1), 35, 36)] + [(("B", i, 2), 36 + 2 * i, 38 + 2 * i) for i in range(4)])
    assert stage0 == expected0
    expected1 = [(("F", 0, 1), 7, 9), (("B", 0, 1), 9, 13), (("F", 1, 1), 13, 15), (("B", 1, 1), 15, 19),
                 (("F", 2, 1), 19, 21), (("B", 2, 1), 21, 25), (("F", 3, 1), 25, 27), (("B", 3, 1), 27, 31)]
    assert [e for e in t.events[1] if e[0][2] == 1] == expected1
    assert t.events[1][-5][0] == ("C", 1, -1) and t.events[1][-5][1:] == (35, 36)
    assert t.busy == [38.0, 38.0] and t.bubble(0) == t.bubble(1) == 6.0


def test_a_colocated_pipeline_step_with_offload_by_hand():
    """The same step with host copies of 3 s: out right after collective 0 (5-8 on both ranks, the LM starts at 8),
    back right after each rank's LM ops: stage 1 ends its LM at 34 and copies back at 34-37 while stage 0 still
    runs; stage 0 ends at 38 and copies back at 38-41, so collective 1 runs 41-42 and the step ends at 50: the
    copy out costs 3 s on the critical path, the copy back 3 s on stage 0 (stage 1 hides it in its idle time)."""
    t = _colocated_pipeline(offload=True)
    assert t.makespan == pytest.approx(50.0)
    assert [(op, s, e) for op, s, e in t.events[0] if op[0] in "CH"] == [
        (("C", 0, -1), 4, 5), (("H", 0, -1), 5, 8), (("H", 1, -1), 38, 41), (("C", 1, -1), 41, 42)]
    assert [(op, s, e) for op, s, e in t.events[1] if op[0] == "H"] == [(("H", 0, -1), 5, 8), (("H", 1, -1), 34, 37)]
