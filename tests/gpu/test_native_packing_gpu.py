"""Packed native-resolution data on a GPU: `mimo train`'s Trainer on images of four sizes, two images of different
sizes, a video and a text-only sample (tests.support.native_data), packed 8 rows into 2, logs the unpacked run's
losses on CUDA in fp32 (the LM's documents through FlexAttention, never a dense `[S, S]` mask: its builder is made to
fail), and under bf16 autocast its tower attends through `varlen_attn` in every block of every step."""

import json
import math

import pytest
import torch

import mimo.models.layers as layers
from mimo.config.load import load_config
from mimo.models import segment_attention as seg
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS
from tests.support.native_data import TINY, manifest

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = ["--train.device=cuda", "--perf.gpu_defaults=false", "--data.global_batch=8", "--model.llm.kv_heads=2",
        "--model.llm.layers=2", "--train.steps=3"]
PACKED = ["--data.packing=true", "--data.pack_length=160"]


def _losses(tmp_path, name: str, data: str, *extra: str) -> list[float]:
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, *CUDA, f"--data.path={data}",
                                                           f"--run.out_dir={tmp_path}", f"--run.name={name}", *extra])
    Trainer(cfg).train()
    return [json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_packed_native_losses_on_cuda_equal_the_unpacked_ones(tmp_path, monkeypatch):
    data = manifest(tmp_path, several=True)
    unpacked = _losses(tmp_path, "unpacked", data)

    def refuse(*args, **kwargs):
        raise AssertionError("a CUDA training step built a dense document mask")

    monkeypatch.setattr(layers, "document_mask", refuse)
    packed = _losses(tmp_path, "packed", data, *PACKED)
    assert len(packed) == len(unpacked) == 3
    for step, (a, b) in enumerate(zip(packed, unpacked)):
        assert math.isfinite(a) and abs(a - b) <= 1e-4 * abs(b), f"step {step}: packed {a} vs unpacked {b}"


@pytest.mark.skipif(seg.varlen_kernel() is None, reason="this PyTorch has no varlen_attn")
def test_packed_native_bf16_steps_attend_through_varlen(tmp_path, monkeypatch):
    calls = []
    real = seg.varlen_segment_attention
    monkeypatch.setattr(seg, "varlen_segment_attention", lambda *a: calls.append(1) or real(*a))
    losses = _losses(tmp_path, "bf16", manifest(tmp_path, several=True), *PACKED, "--precision.dtype=bfloat16")
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert len(calls) >= 3 * 2  # each of the tower's 2 blocks in each step's forward
