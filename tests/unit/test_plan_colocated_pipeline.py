"""`mimo plan` and colocated layouts whose LM is pipelined: the predicted step as its three phases (encoder
forwards, the LM's pipeline alone, encoder backwards) with the rows exchanged between them, what encoder
offload adds and frees, and the candidates the planner proposes (CPU, no processes)."""

from __future__ import annotations

import pytest

from mimo.config.load import load_config
from mimo.config.schema import ModuleLayoutConfig
from mimo.parallel.layout import Layout
from mimo.planner.candidates import (
    KIND,
    colocated_pipelined_candidates,
    cost_at,
    label,
    make_plan,
    with_modules,
)
from mimo.planner.memory import estimate, in_flight, module_sizes, offloaded_bytes, stage_usage
from mimo.planner.network import Network
from mimo.planner.predict import Setting, _tail, module_piece, predict
from mimo.planner.profile import Profile
from mimo.planner.simulate import one_f_one_b_ops, simulate

# Round figures (as tests/unit/test_planner_predict.py's): 100 TFLOP/s, 1 TB/s, 1 us a kernel.
PROFILE = Profile("test", matmul_tflops=100.0, matmul_fixed_s=0.0, attention_tflops=100.0, attention_fixed_s=0.0,
                  attention_backward_ratio=2.0, memory_gbps=1000.0, kernel_s=1e-6, launch_s=0.0)
DEMO = ["--model.llm.layers=4", "--parallel.microbatches=4", "--precision.dtype=bfloat16"]
OFFLOAD = ("--train.device=cuda", '--perf.encoder_offload=["images"]')


def _colocated_pipeline(tp: int = 2, pp: int = 2) -> dict[str, ModuleLayoutConfig]:
    """images tp1 dp8 on every rank; the LM tp x pp on the same 8 ranks."""
    return {"images": ModuleLayoutConfig(), "language": ModuleLayoutConfig(tp=tp, pp=pp, sequence_parallel=tp > 1)}


def _setup(extra: tuple[str, ...] = ()):
    """demo_vlm (4 LM layers, 4 microbatches, bf16) and `extra` on `_colocated_pipeline()`'s layout."""
    modules = _colocated_pipeline()
    cfg = with_modules(load_config("configs/demo_vlm.toml", [*DEMO, *extra]), modules)
    layout = Layout.from_config(modules, cfg.model.module_names, 8)
    return cfg, modules, layout, Setting(cfg, module_sizes(cfg), PROFILE, Network())


def test_the_step_is_encoder_forwards_rows_lm_pipeline_rows_encoder_backwards():
    """images tp1 dp8 + LM tp2 pp2 dp2, 4 microbatches: every GPU runs the encoder's 4 forwards; an all-to-all
    hands each LM first-stage GPU its lane's rows of the step (16 samples x 16 patches x hidden 128, bf16: the
    busiest GPU's share, beside an encoder lane's 4 samples sent to tp 2 GPUs); the LM's 1F1B runs alone (its two
    stages as a pipelined layout's, with their sends); the gradients come back the same way (an LM lane's lead
    sends its 16 samples' to the encoder lanes); then the 4 encoder backwards, then each GPU's reductions and
    update (the encoder's and its LM stage's)."""
    cfg, modules, layout, s = _setup()
    lm, images = layout.grids["language"], layout.grids["images"]
    enc = module_piece(s, "images", images, modules["images"])
    stages = [module_piece(s, "language", lm, modules["language"], p) for p in range(2)]
    net = s.network
    send = net.send(32 / (4 * 2) * 40 * 128 * 2, 0, 4)  # a stage's microbatch: 4 samples x 40 rows x 128 bf16
    lm_only = simulate([one_f_one_b_ops(r, 2, 4) for r in range(2)], {0: [], 1: [0]},
                       {p: st.forward for p, st in enumerate(stages)}, {p: st.backward for p, st in enumerate(stages)},
                       {0: send, 1: 0.0})
    rows = net.exchange(16 * 16 * 128 * 2, 0, 1, 8)
    tails = [[_tail(s, "images", images, modules["images"], 0, enc.backward, 4 * (enc.forward_s + enc.backward_s)),
              _tail(s, "language", lm, modules["language"], p, stages[p].backward, 0.0)] for p in range(2)]
    tail = max(sum(sum(t) for t in parts) for parts in tails)
    p = predict(s, layout, modules)
    assert p.step_s == pytest.approx(4 * enc.forward + rows + lm_only.makespan + rows + 4 * enc.backward + tail)
    assert p.bubble_s == pytest.approx(min(lm_only.bubble(r) for r in range(2)))
    assert p.step_s == pytest.approx(p.compute_s + p.comm_s + p.reduce_s + p.optimizer_s + p.bubble_s)


def test_offload_adds_two_host_copies():
    """perf.encoder_offload copies the encoder's weights and moments (12 of its 16 bytes a parameter) out after the
    rows' exchange and back after the LM's pipeline, both on the critical path: the first LM stage starts last and
    ends last."""
    cfg, modules, layout, plain = _setup()
    base = predict(plain, layout, modules).step_s
    states = stage_usage(cfg, "images", plain.sizes["images"], layout.grids["images"], modules["images"], 0, 1).states
    moved = offloaded_bytes(cfg, states, layout.grids["images"], modules["images"])
    assert moved == pytest.approx(states * 12 / 16)
    off = predict(_setup(OFFLOAD)[3], layout, modules)
    assert off.step_s == pytest.approx(base + 2 * moved / 53.5e9)


def test_the_encoders_activations_wait_across_the_lm_pipeline():
    """LM stage i holds min(pp - i, m) microbatches in flight (2, 1) and every GPU the encoder's activations of
    all 4 microbatches. Two moments per LM stage, the worse counts: inside the LM's pipeline (the encoder's
    gradients, 4 of its 16 bytes a parameter, not made yet) and at the encoder's first backward (the LM's
    activations gone, every state there). Offload takes the rest of its states off the GPU for the pipeline. The
    rows cross in bf16: the LM's first stage holds its lane's (16 samples x 16 rows x 128 x 2 bytes) across the
    pipeline, every GPU its encoder lane's gradients (4 samples' worth) at the encoder's backward."""
    cfg, modules, layout, s = _setup()
    lm, images = layout.grids["language"], layout.grids["images"]
    assert [in_flight(cfg, layout, "language", r) for r in range(2)] == [2, 1]
    stages = [stage_usage(cfg, "language", s.sizes["language"], lm, modules["language"], r, 2 - r) for r in range(2)]
    enc = stage_usage(cfg, "images", s.sizes["images"], images, modules["images"], 0, 1)

    lane_rows, own_rows = 16 * 16 * 128 * 2, 4 * 16 * 128 * 2

    def peak(kept: float) -> float:
        return max(max(u.states + kept + u.activations + 4 * enc.activations + (lane_rows if u is stages[0] else 0),
                       u.states + enc.states + 4 * enc.activations + own_rows) for u in stages)

    plain = estimate(cfg, layout, s.sizes, modules)
    assert plain.states + plain.activations == pytest.approx(peak(enc.states * 12 / 16))
    off_cfg, *_ = _setup(OFFLOAD)
    off = estimate(off_cfg, layout, s.sizes, modules)
    assert off.states + off.activations == pytest.approx(peak(0.0))
    assert off.peak < plain.peak


def test_the_planner_proposes_colocated_pipelines_at_their_fastest_lm_tp():
    """For demo_vlm (4 LM layers) on 8 GPUs: pp2 and pp4 with images on every GPU at tp1, the LM at tp1 (the
    fastest of those that fit: its tiny products gain nothing from a split), each again interleaved where the
    layers allow (pp2 x v2, not pp4 x v2); named "colocated pipelined"; `mimo plan` lists them."""
    cfg = load_config("configs/demo_vlm.toml", DEMO)
    setting = Setting(cfg, module_sizes(cfg), PROFILE, Network())
    rows = colocated_pipelined_candidates(cfg, 8, lambda m: cost_at(setting, m, 4, 8, 80.0))
    assert [label(r.layout, r.modules) for r in rows] == ["images dp8 | LM pp2 dp4", "images dp8 | LM pp2 v2 dp4",
                                                         "images dp8 | LM pp4 dp2"]
    assert {KIND[r.klass] for r in rows} == {"colocated pipelined"} and all(r.fits for r in rows)
    assert "images whole on every GPU before and after the LM's pp2 pipeline" in rows[0].why
    plan = make_plan(cfg, 8, 80.0)
    assert any(KIND[r.klass] == "colocated pipelined" for r in plan.rows)
