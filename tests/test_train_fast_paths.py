"""`train.compile`, `train.chunked_loss` and `train.fuse_qkv` (the GPU fast paths, here on the CPU in fp32)
train like the plain trainer: per-step losses within 1e-5 (chunked, fused q/k/v; FSDP with fused q/k/v:
tests/test_data_parallel.py) or 1e-4 (compiled) relative, final weights within 1e-4 of their scale.
Unsupported layouts are refused with an error that names the field."""

import json

import pytest
import torch
from safetensors.torch import load_file

from mimo.config import ConfigError
from mimo.parallel.layout import Layout
from mimo.parallel.plan import validate_plan
from mimo.train.trainer import Trainer
from tests.tiny_run import tiny_config

STEPS = ["--train.steps=4"]


def run(tmp_path, name: str, *switches: str) -> tuple[list[float], dict]:
    out = tmp_path / name
    Trainer(tiny_config(out, *STEPS, *switches)).train()
    losses = [json.loads(line)["loss"] for line in (out / "tiny" / "metrics.jsonl").read_text().splitlines()]
    return losses, load_file(out / "tiny" / "checkpoint" / "model.safetensors")


@pytest.mark.parametrize("switches, rtol", [
    (["--train.chunked_loss=true"], 1e-5),
    (["--train.compile=true"], 1e-4),
    (["--train.fuse_qkv=true"], 1e-5),
])
def test_fast_path_trains_like_the_plain_trainer(tmp_path, switches, rtol):
    plain_losses, plain = run(tmp_path, "plain")
    fast_losses, fast = run(tmp_path, "fast", *switches)
    assert len(fast_losses) == len(plain_losses) == 4
    for a, b in zip(fast_losses, plain_losses):
        assert abs(a - b) <= rtol * abs(b), (fast_losses, plain_losses)
    for name, w in plain.items():
        # Adam divides each gradient by its own running scale, so fp32 rounding of a different summation
        # order reaches the weights relatively larger than the losses; a key bias's exact gradient is zero
        # (softmax is shift invariant per query), so there both runs step on rounding noise alone.
        slack = 1e-6 if name.endswith("k_proj.bias") else 0.0
        assert (fast[name] - w).abs().max() <= 1e-4 * w.abs().max() + slack, name
    torch.compiler.reset()


@pytest.mark.parametrize("overrides, message", [
    (["--train.compile=true", "--parallel.modules.language.tp=2", "--model.llm.kv_heads=2"],
     "train.compile: parallel.modules.language uses tp/cp > 1 or fsdp"),
    (["--train.compile=true", "--parallel.modules.images.fsdp=true"],
     "train.compile: parallel.modules.images uses tp/cp > 1 or fsdp"),
    (["--train.compile=true", "--parallel.modules.images.size=2", "--parallel.modules.language.offset=2",
      "--parallel.modules.language.size=2"], "train.compile: modules on disjoint ranks"),
    (["--train.chunked_loss=true", "--parallel.modules.language.tp=2", "--model.llm.kv_heads=2"],
     "train.chunked_loss: parallel.modules.language.tp = 2 already uses the vocab-parallel loss"),
    (["--train.fuse_qkv=true", "--parallel.modules.images.tp=2"],
     "train.fuse_qkv: parallel.modules.images.tp = 2 shards q, k and v by heads"),
])
def test_unsupported_layouts_are_refused_before_any_collective(tmp_path, overrides, message):
    cfg = tiny_config(tmp_path, *overrides)
    layout = Layout.from_config(cfg.parallel.modules, ["language", *cfg.model.modalities], 4)
    with pytest.raises(ConfigError, match=message):
        validate_plan(cfg, layout)
