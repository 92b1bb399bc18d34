"""Packing on a GPU trains the unpacked run's samples without ever building an `[S, S]` mask: `mimo train
configs/demo_packed.toml` on CUDA (FlexAttention over a block mask) has demo_vlm's loss curve on CUDA at every
one of 20 steps (the same samples, unpacked; see test_parallel_cli), eager and with compiled blocks, and a packed
step in this process runs with the dense mask builder made to fail."""

import math

import pytest
import torch

import mimo.models.layers as layers
from mimo.config.load import load_config
from mimo.train.trainer import Trainer
from tests.support.cli_curve import ROOT, STEPS, loss_curve

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = ["--train.device=cuda", "--perf.gpu_defaults=false"]
RTOL = 1e-4


@pytest.mark.parametrize("compiled", [False, True])
def test_packed_curve_on_cuda_equals_the_unpacked_one(tmp_path, compiled):
    extra = ["--perf.compile=true"] if compiled else []
    packed = loss_curve(tmp_path, "packed", "demo_packed.toml", 1, *CUDA, *extra, timeout=600)
    unpacked = loss_curve(tmp_path, "unpacked", "demo_vlm.toml", 1, *CUDA, *extra, timeout=600)
    assert len(packed) == len(unpacked) == 20
    for step, (a, b) in enumerate(zip(packed, unpacked)):
        assert math.isfinite(a) and abs(a - b) <= RTOL * abs(b), f"step {step}: packed {a} vs unpacked {b}"


def test_a_packed_cuda_step_builds_no_dense_mask(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a CUDA training step built a dense document mask")

    monkeypatch.setattr(layers, "document_mask", refuse)
    cfg = load_config(ROOT / "configs" / "demo_packed.toml",
                      [*CUDA, *STEPS, "--train.steps=2", f"--run.out_dir={tmp_path}"])
    summary = Trainer(cfg).train()
    assert math.isfinite(summary["final_loss"])
