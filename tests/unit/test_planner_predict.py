"""The planner's cost model by hand, the ranking by predicted step time, `mimo plan --json`, profiles."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mimo.cli import main
from mimo.config.load import load_config
from mimo.config.schema import ConfigError, ModuleLayoutConfig
from mimo.parallel.grid import Grid
from mimo.planner import calibrate as cal
from mimo.planner.candidates import cost_at, layout_of, make_plan
from mimo.planner.cost import (
    KERNELS_BACKWARD,
    KERNELS_FORWARD,
    _moe_feed_forward,
    decoder_layer,
    encoder_layer,
    matmul_s,
)
from mimo.planner.memory import estimate, module_sizes
from mimo.planner.network import Network
from mimo.planner.predict import Setting, module_piece, predict
from mimo.planner.profile import PROFILES, Profile, load_profile, shipped_profile

# Round figures, so the expected times below can be written out: 100 TFLOP/s products and attention, no
# fixed parts, 1 TB/s memory, 1 us per kernel.
PROFILE = Profile("test", matmul_tflops=100.0, matmul_fixed_s=0.0, attention_tflops=100.0, attention_fixed_s=0.0,
                  attention_backward_ratio=2.0, memory_gbps=1000.0, kernel_s=1e-6, launch_s=0.0)
TINY = ["--model.llm.vocab=272", "--model.llm.hidden=32", "--model.llm.layers=2", "--model.llm.heads=4",
        "--model.llm.kv_heads=2", "--model.llm.mlp=64", "--data.global_batch=8", "--data.seq_len=16",
        "--precision.dtype=bfloat16"]


def test_a_decoder_layer_by_hand():
    """hidden 32, 4 heads of 8, 2 kv heads, mlp 64, 4 sequences of 16 tokens (T = 64) on one GPU:
    products q 32x32, k and v 16x32 each, o 32x32, gate and up 64x32, down 32x64 -> 2 T (sum n k) FLOPs."""
    cfg = load_config("configs/demo_vlm.toml", TINY)
    piece = decoder_layer(cfg, PROFILE, Network(), Grid(), ModuleLayoutConfig(), samples=4, seq=16)
    tokens = 64
    nk = 32 * 32 + 2 * 16 * 32 + 32 * 32 + 2 * 64 * 32 + 32 * 64
    products = 2 * tokens * nk / 1e14
    attention = 4 * 2 * 16 * 16 * 4 * 8 / 1e14
    elementwise = tokens * (40 * 32 + 6 * 64) / 1e12
    assert piece.forward_s == pytest.approx(products + attention + elementwise + KERNELS_FORWARD * 1e-6)
    assert piece.backward_s == pytest.approx(2 * products + 2 * attention + 2 * elementwise + KERNELS_BACKWARD * 1e-6)
    assert piece.forward_comm_s == piece.backward_comm_s == 0.0


def test_tensor_parallelism_halves_products_and_adds_two_all_reduces_each_way():
    cfg = load_config("configs/demo_vlm.toml", TINY)
    net = Network()
    one = decoder_layer(cfg, PROFILE, net, Grid(), ModuleLayoutConfig(), samples=4, seq=16)
    two = decoder_layer(cfg, PROFILE, net, Grid(tp=2), ModuleLayoutConfig(), samples=4, seq=16)
    assert two.forward_comm_s == pytest.approx(2 * net.all_reduce(64 * 32 * 2, 0, 1, 2))
    assert two.backward_comm_s == two.forward_comm_s
    assert two.forward_s < one.forward_s and matmul_s(PROFILE, 64, 16, 32) == pytest.approx(2 * 64 * 16 * 32 / 1e14)


def test_one_gpu_step_is_the_modules_work_and_the_update():
    """No communication on one GPU: step = compute + optimizer, and MFU = model FLOPs / step / peak."""
    cfg = load_config("configs/demo_vlm.toml", TINY)
    sizes = module_sizes(cfg)
    modules = {"language": ModuleLayoutConfig(), "images": ModuleLayoutConfig()}
    p = predict(Setting(cfg, sizes, PROFILE, Network()), layout_of(cfg, modules, 1), modules)
    assert p.comm_s == p.reduce_s == p.bubble_s == 0.0
    assert p.step_s == pytest.approx(p.compute_s + p.optimizer_s)
    assert p.mfu == pytest.approx(p.model_tflops_per_gpu / cfg.metrics.peak_tflops)


def test_plan_ranks_fitting_rows_by_predicted_time_and_json_lists_them(capsys, tmp_path):
    profile = tmp_path / "p.json"
    PROFILE.save(profile)
    cfg = load_config("configs/demo_vlm.toml")
    plan = make_plan(cfg, 8, 80, load_profile(profile))
    fitting = [r.prediction.step_s for r in plan.rows if r.fits]
    assert fitting == sorted(fitting) and len(fitting) > 3
    with pytest.raises(SystemExit) as e:
        main(["plan", "configs/demo_vlm.toml", "--gpus", "8", "--gpu-memory-gib", "80", "--json",
              "--profile", str(profile)])
    assert e.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 8 and out["nodes"] == 1 and out["profile"] == "test"
    rows = out["candidates"]
    assert len(rows) == len(plan.rows) and [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    for r in rows:
        assert r["predicted_step_s"] > 0 and set(r) >= {"label", "kind", "grids", "fits", "peak_gib", "mfu",
                                                        "tokens_per_s_per_gpu", "bubble_s", "reduce_s"}
    assert rows[0]["predicted_step_s"] == pytest.approx(fitting[0])
    assert "[parallel.modules.language]" in out["best_toml"]


def test_more_gpus_than_a_node_put_data_parallel_reductions_on_the_network():
    """The same layout on 16 GPUs of 8 per node and of 16 per node: only the slower link differs."""
    cfg = load_config("configs/demo_vlm.toml", [*TINY, "--data.global_batch=16"])
    sizes = module_sizes(cfg)
    modules = {"language": ModuleLayoutConfig(), "images": ModuleLayoutConfig()}
    layout = layout_of(cfg, modules, 16)
    split = predict(Setting(cfg, sizes, PROFILE, Network(gpus_per_node=8)), layout, modules)
    whole = predict(Setting(cfg, sizes, PROFILE, Network(gpus_per_node=16)), layout, modules)
    assert split.reduce_s > whole.reduce_s and split.compute_s == whole.compute_s


def test_profiles_are_shipped_and_bad_ones_refused(tmp_path):
    assert {p.name for p in PROFILES.glob("*.json")} >= {"cpu.json", "h200.json"}
    assert shipped_profile("cuda").device.startswith("NVIDIA") and shipped_profile("cpu").device == "cpu"
    with pytest.raises(ConfigError, match="--profile .*no such file.*--calibrate"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "half.json").write_text('{"device": "x", "matmul_tflops": 1}')
    with pytest.raises(ConfigError, match="missing .*matmul_fixed_s"):
        load_profile(tmp_path / "half.json")


def test_cli_calibrate_writes_a_profile_the_planner_reads(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    with pytest.raises(SystemExit) as e:
        main(["plan", "configs/demo_vlm.toml", "--calibrate", "--out", str(out), *TINY])
    assert e.value.code == 0
    assert "profile of cpu written" in capsys.readouterr().out
    profile = load_profile(out)
    assert profile.matmul_tflops > 0 and profile.memory_gbps > 0
    assert {"decoder.eager", "vit.eager", "audio.eager"} <= set(profile.layer_factor)
    assert make_plan(load_config("configs/demo_vlm.toml", TINY), 2, 80, profile).rows[0].prediction.step_s > 0



def test_a_small_layer_takes_the_hosts_launches_when_they_outlast_the_gpu():
    """The same layer with 10 us to issue a kernel: the host's 14 (forward) and 28 (backward) launches outlast the
    GPU's work, so the layer is their time, times the decoder's factor (2)."""
    profile = dataclasses.replace(PROFILE, launch_s=10e-6, layer_factor={"decoder.eager": 2.0})
    cfg = load_config("configs/demo_vlm.toml", TINY)
    piece = decoder_layer(cfg, profile, Network(), Grid(), ModuleLayoutConfig(), samples=4, seq=16)
    assert piece.forward_s == pytest.approx(2.0 * KERNELS_FORWARD * 10e-6)
    assert piece.backward_s == pytest.approx(2.0 * KERNELS_BACKWARD * 10e-6)


def test_layer_factors_are_the_measured_time_over_the_model(monkeypatch):
    cfg = load_config("configs/demo_vlm.toml", [*TINY, "--perf.compile=false"])
    monkeypatch.setattr(cal, "timed", lambda fn, device, reps, warmup: 4e-3)
    factors, shapes, layers = cal.layer_factors(cfg, "cpu", PROFILE)
    assert set(factors) == set(layers) == {"decoder.eager", "vit.eager", "audio.eager"}
    for key, factor in factors.items():
        kind = key.split(".")[0]
        assert factor == pytest.approx(4e-3 / cal.modelled_layer(cfg, kind, PROFILE, shapes[kind], False))
        assert layers[key] == 4e-3


def test_a_profile_with_figures_of_a_retired_step_still_loads(tmp_path):
    """Profiles calibrated before perf.step_graph was retired hold its CUDA-graph figures under `captured`."""
    PROFILE.save(tmp_path / "p.json")
    older = {**json.loads((tmp_path / "p.json").read_text()), "captured": {"matmul_fixed_s": 1e-6}}
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert load_profile(tmp_path / "older.json") == PROFILE

def test_master_weights_keep_4_bytes_whole_and_shard_12_over_the_lanes():
    """The tiny LM's trainable states (16 B each without master weights) on 4 data lanes: 4 + 12/4 = 7 B."""
    modules = {"language": ModuleLayoutConfig(), "images": ModuleLayoutConfig()}
    plain = load_config("configs/demo_vlm.toml", TINY)
    master = load_config("configs/demo_vlm.toml", [*TINY, "--precision.master_weights=true"])
    layout = layout_of(plain, modules, 4)
    ratio = estimate(master, layout, module_sizes(master), modules).states / \
        estimate(plain, layout, module_sizes(plain), modules).states
    assert ratio == pytest.approx(7 / 16)


def test_a_planned_row_is_costed_with_the_gpu_defaults_mimo_train_applies():
    """On CUDA the keys a config leaves unset take their GPU defaults (precision.master_weights among them), at
    every microbatch count the planner tries: the row's states are the master-weight ones."""
    cfg = load_config("configs/demo_vlm.toml", [*TINY, "--train.device=cuda"])
    modules = {"language": ModuleLayoutConfig(), "images": ModuleLayoutConfig()}
    master = load_config("configs/demo_vlm.toml", [*TINY, "--train.device=cuda", "--precision.master_weights=true"])
    row = cost_at(Setting(cfg, module_sizes(cfg), PROFILE, Network()), modules, 2, 4, 80.0)
    expected = estimate(master, layout_of(master, modules, 4), module_sizes(master), modules)
    assert row.usage.states == pytest.approx(expected.states)


def test_choose_microbatches_takes_the_fastest_count_that_fits(tmp_path):
    cfg = load_config("configs/demo_vlm.toml", [*TINY, "--data.global_batch=16"])
    fixed = make_plan(cfg, 2, 80, PROFILE)
    chosen = make_plan(cfg, 2, 80, PROFILE, choose_microbatches=True)
    assert {r.microbatches for r in fixed.rows} == {cfg.parallel.microbatches}
    assert chosen.rows[0].prediction.step_s <= fixed.rows[0].prediction.step_s
    assert all(16 % r.microbatches == 0 for r in chosen.rows)


def test_a_mixture_of_experts_feed_forward_by_hand():
    """4 experts of width 32, top 2, 64 tokens of hidden 32: the router (64 x 4 x 32), then per expert
    64 x 2 / 4 = 32 rows through three 32 x 32 products; with ep 2 two experts a rank, 64 rows each, and the
    dispatch and combine all-to-alls of 64 x 2 x 32 bf16 values over the 2 ranks, each way."""
    cfg = load_config("configs/demo_vlm.toml", [*TINY, "--model.llm.moe_experts=4", "--model.llm.moe_mlp=32"])
    net = Network()
    one = _moe_feed_forward(cfg, PROFILE, net, Grid(), ModuleLayoutConfig(), tokens=64)
    assert one.forward_s == pytest.approx((2 * 64 * 4 * 32 + 4 * 3 * 2 * 32 * 32 * 32) / 1e14)
    assert one.backward_s == pytest.approx(2 * one.forward_s) and one.forward_comm_s == 0.0
    two = _moe_feed_forward(cfg, PROFILE, net, Grid(dp=2), ModuleLayoutConfig(ep=2), tokens=64)
    assert two.forward_s == pytest.approx((2 * 64 * 4 * 32 + 2 * 3 * 2 * 64 * 32 * 32) / 1e14)
    assert two.forward_comm_s == pytest.approx(2 * net.all_to_all(64 * 2 * 32 * 2, 0, 1, 2))
    # Under tp2 the MoE runs TP-replicated (mimo.parallel.tensor): the same products on every TP rank.
    tp2 = _moe_feed_forward(cfg, PROFILE, net, Grid(tp=2), ModuleLayoutConfig(), tokens=64)
    assert tp2.forward_s == pytest.approx(one.forward_s)


def test_activation_checkpointing_runs_the_blocks_forward_again_in_the_backward():
    """A checkpointed module's blocks (not the LM's head, not the ViT's patch embedding or projector) add their
    forward, TP all-reduces included, to the backward: tiny LM tp2 on 2 GPUs, 8 samples (of the task's row length)
    through its 2 layers; 8 images through the ViT's 2 blocks."""
    modules = {"language": ModuleLayoutConfig(tp=2), "images": ModuleLayoutConfig(tp=2)}
    plain = load_config("configs/demo_vlm.toml", TINY)
    ckpt = load_config("configs/demo_vlm.toml", [*TINY, '--perf.activation_checkpointing=["language", "images"]'])
    layout = layout_of(plain, modules, 2)
    net, seq = Network(), module_sizes(plain)["language"].tokens_per_sample
    blocks = {"language": decoder_layer(plain, PROFILE, net, layout.grids["language"], modules["language"], 8, seq),
              "images": encoder_layer(plain, PROFILE, net, "images", layout.grids["images"], 8)}
    for name, block in blocks.items():
        one, two = (module_piece(Setting(c, module_sizes(c), PROFILE, net), name, layout.grids[name], modules[name])
                    for c in (plain, ckpt))
        assert (two.forward_s, two.forward_comm_s) == (one.forward_s, one.forward_comm_s)
        assert two.backward_s == pytest.approx(one.backward_s + 2 * block.forward_s)
        assert two.backward_comm_s == pytest.approx(one.backward_comm_s + 2 * block.forward_comm_s)
        assert block.forward_comm_s > 0
