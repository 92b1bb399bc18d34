"""A captured step (perf.step_graph) is predicted from the profile's CUDA-graph timed figures, an eager step
from the eager ones: the selection (`Profile.under`), a decoder layer by hand each way, and what
`mimo plan --calibrate` records (the captured figures only on CUDA)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mimo.config.load import load_config
from mimo.config.schema import ModuleLayoutConfig
from mimo.parallel.grid import Grid
from mimo.planner import calibrate as cal
from mimo.planner.candidates import layout_of
from mimo.planner.cost import KERNELS_BACKWARD, KERNELS_FORWARD, decoder_layer
from mimo.planner.memory import module_sizes
from mimo.planner.network import Network
from mimo.planner.predict import Setting, predict
from mimo.planner.profile import PROFILES, Profile, load_profile

# Round figures (as tests/unit/test_planner_predict.py's): 100 TFLOP/s, no fixed parts, 1 TB/s, 1 us a kernel
# on the GPU and 10 us to issue one; eagerly a decoder layer is corrected by 2, in a graph by 0.5, where a
# product also costs 1 us more. The ViT has no captured factor: it keeps its eager one.
PROFILE = Profile("test", matmul_tflops=100.0, matmul_fixed_s=0.0, attention_tflops=100.0, attention_fixed_s=0.0,
                  attention_backward_ratio=2.0, memory_gbps=1000.0, kernel_s=1e-6, launch_s=10e-6,
                  layer_factor={"decoder.eager": 2.0, "vit.eager": 3.0},
                  captured={"matmul_fixed_s": 1e-6, "layer_factor": {"decoder.eager": 0.5}})
TINY = ["--model.llm.vocab=272", "--model.llm.hidden=32", "--model.llm.layers=2", "--model.llm.heads=4",
        "--model.llm.kv_heads=2", "--model.llm.mlp=64", "--data.global_batch=8", "--data.seq_len=16",
        "--precision.dtype=bfloat16", "--perf.step_graph=false", "--perf.compile=false"]


def _configs():
    eager = load_config("configs/demo_vlm.toml", TINY)
    return eager, dataclasses.replace(eager, perf=dataclasses.replace(eager.perf, step_graph=True))


def test_under_a_captured_step_the_graph_figures_replace_the_eager_ones_kind_by_kind():
    graph = PROFILE.under(True)
    assert graph.matmul_fixed_s == 1e-6 and graph.matmul_tflops == 100.0 and graph.launch_s == 10e-6
    assert graph.factor("decoder", compiled=False) == 0.5
    assert graph.factor("vit", compiled=False) == 3.0  # not timed in a graph: the eager factor
    assert graph.factor("decoder", compiled=True) == 0.5  # no compiled figure: the (captured) eager one
    assert graph.captured == {} and graph.under(True) == graph
    assert PROFILE.under(False) is PROFILE
    plain = dataclasses.replace(PROFILE, captured={})
    assert plain.under(True) is plain


def test_a_decoder_layer_by_hand_eager_and_captured():
    """hidden 32, 4 heads of 8, 2 kv heads, mlp 64, 4 sequences of 16 tokens (T = 64), 7 products.
    Eagerly the host's 14 (forward) and 28 (backward) launches of 10 us outlast the GPU's work: the layer is
    their time, x 2. Captured, the GPU's work: the products (each 1 us more), attention, element-wise traffic
    and 1 us a kernel, x 0.5."""
    eager_cfg, graph_cfg = _configs()
    products = 2 * 64 * (32 * 32 + 2 * 16 * 32 + 32 * 32 + 2 * 64 * 32 + 32 * 64) / 1e14
    attention = 4 * 2 * 16 * 16 * 4 * 8 / 1e14
    elementwise = 64 * (40 * 32 + 6 * 64) / 1e12
    eager = decoder_layer(eager_cfg, PROFILE.under(False), Network(), Grid(), ModuleLayoutConfig(), 4, 16)
    assert eager.forward_s == pytest.approx(2.0 * KERNELS_FORWARD * 10e-6)
    assert eager.backward_s == pytest.approx(2.0 * KERNELS_BACKWARD * 10e-6)
    graph = decoder_layer(graph_cfg, PROFILE.under(True), Network(), Grid(), ModuleLayoutConfig(), 4, 16)
    forward = products + 7 * 1e-6 + attention + elementwise + KERNELS_FORWARD * 1e-6
    backward = 2 * products + 14 * 1e-6 + 2 * attention + 2 * elementwise + KERNELS_BACKWARD * 1e-6
    assert graph.forward_s == pytest.approx(0.5 * forward)
    assert graph.backward_s == pytest.approx(0.5 * backward)


def test_predict_uses_the_captured_figures_only_for_a_captured_step():
    eager_cfg, graph_cfg = _configs()
    modules = {"language": ModuleLayoutConfig(), "images": ModuleLayoutConfig()}
    plain = dataclasses.replace(PROFILE, captured={})

    def step(cfg, profile):
        return predict(Setting(cfg, module_sizes(cfg), profile, Network()), layout_of(cfg, modules, 1), modules)

    assert step(eager_cfg, PROFILE) == step(eager_cfg, plain)
    assert step(graph_cfg, PROFILE) == step(graph_cfg, PROFILE.under(True))
    assert step(graph_cfg, PROFILE).compute_s != step(graph_cfg, plain).compute_s


def test_profiles_without_captured_figures_still_load_and_predict_as_before(tmp_path):
    older = json.loads((PROFILES / "h200.json").read_text())
    assert older.pop("captured")  # the shipped profile has captured figures; a profile from before had none
    (tmp_path / "older.json").write_text(json.dumps(older))
    shipped = load_profile(tmp_path / "older.json")
    assert shipped.under(True) is shipped and shipped.captured == {}
    PROFILE.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == PROFILE


def test_captured_layer_factors_are_graph_time_over_the_captured_model(monkeypatch):
    """On the CPU with graph_timed standing in (CUDA graphs need CUDA): each eager key gets a captured factor,
    the graph's seconds over the model of a captured step at the captured lines, and its seconds recorded."""
    cfg = load_config("configs/demo_vlm.toml", TINY)
    monkeypatch.setattr(cal, "graph_timed", lambda fn: 1e-3)
    monkeypatch.setattr(cal, "timed", lambda fn, device, reps, warmup: 4e-3)
    graph_lines = dataclasses.replace(PROFILE, layer_factor={}, captured={}, matmul_fixed_s=1e-6)
    eager_lines = dataclasses.replace(graph_lines, matmul_fixed_s=0.0)
    factors, graphed, shapes, layers = cal.layer_factors(cfg, "cpu", eager_lines, graph_lines)
    assert set(graphed) == set(factors) == {"decoder.eager", "vit.eager", "audio.eager"}
    for key, factor in graphed.items():
        kind = key.split(".")[0]
        assert factor == pytest.approx(1e-3 / cal.modelled_layer(cfg, kind, graph_lines, shapes[kind], False, True))
        assert factors[key] == pytest.approx(4e-3 / cal.modelled_layer(cfg, kind, eager_lines, shapes[kind], False))
        assert layers[f"{key}.graph"] == 1e-3 and layers[key] == 4e-3
    assert cal.modelled_layer(cfg, "vit", graph_lines, shapes["vit"], False, True) < \
        cal.modelled_layer(cfg, "vit", graph_lines, shapes["vit"], False)  # no host launches when captured


def test_a_layer_that_cannot_be_captured_keeps_its_eager_factor(monkeypatch):
    cfg = load_config("configs/demo_vlm.toml", TINY)

    def refuse(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cal, "graph_timed", refuse)
    monkeypatch.setattr(cal, "timed", lambda fn, device, reps, warmup: 4e-3)
    factors, graphed, _, layers = cal.layer_factors(cfg, "cpu", PROFILE, PROFILE)
    assert graphed == {} and set(factors) == {"decoder.eager", "vit.eager", "audio.eager"}
    assert layers["vit.eager.graph"].startswith("failed: RuntimeError: operation not permitted")
