"""`mimo plan --calibrate` on a GPU: every layer kind gets a finite, positive factor from timings that hold the
host's launches. Marked `gpu`, skipped without a CUDA device."""

import math

import pytest
import torch

from mimo.config.load import load_config
from mimo.planner.calibrate import calibrate

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TINY = ["--train.device=cuda", "--perf.compile=false", "--model.llm.hidden=64", "--model.llm.layers=2",
        "--model.llm.heads=4", "--model.llm.kv_heads=2", "--model.llm.mlp=128"]


def test_calibration_on_cuda_gives_every_layer_kind_a_factor():
    profile = calibrate(load_config("configs/demo_vlm.toml", TINY), "cuda")
    assert set(profile.layer_factor) == {"decoder.eager", "vit.eager", "audio.eager"}
    assert all(math.isfinite(f) and f > 0 for f in profile.layer_factor.values())
    assert 0 < profile.kernel_s and 0 < profile.launch_s and profile.matmul_tflops > 0
