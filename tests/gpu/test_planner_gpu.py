"""`mimo plan --calibrate`'s CUDA-graph timing on a GPU: a small layer replayed from a CUDA graph takes no longer
than its eager, synchronised call (which also holds the host's launches), and a calibration records the captured
figures for every layer it timed. Marked `gpu`, skipped without a CUDA device."""

import math

import pytest
import torch

from mimo.config.load import load_config
from mimo.planner.calibrate import calibrate, graph_timed, layer_step, timed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TINY = ["--train.device=cuda", "--perf.compile=false", "--model.llm.hidden=64", "--model.llm.layers=2",
        "--model.llm.heads=4", "--model.llm.kv_heads=2", "--model.llm.mlp=128"]


@pytest.mark.parametrize("kind", ["vit", "decoder"])
def test_a_small_layer_replayed_from_a_graph_is_no_slower_than_its_eager_call(kind):
    step, _ = layer_step(load_config("configs/demo_vlm.toml", TINY), kind, "cuda", compiled=False)
    eager = timed(step, "cuda", reps=5, warmup=2)
    graphed = graph_timed(step)
    assert math.isfinite(graphed) and 0 < graphed <= eager


def test_calibration_on_cuda_records_the_captured_figures():
    profile = calibrate(load_config("configs/demo_vlm.toml", TINY), "cuda")
    captured = profile.captured
    assert set(captured["layer_factor"]) == set(profile.layer_factor)
    assert all(math.isfinite(f) and f > 0 for f in captured["layer_factor"].values())
    assert 0 < captured["matmul_tflops"] and 0 <= captured["matmul_fixed_s"] < profile.matmul_fixed_s + 1e-6
    graph = profile.under(True)
    assert graph.attention_tflops == captured["attention_tflops"] and graph.layer_factor == captured["layer_factor"]
