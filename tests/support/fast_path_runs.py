"""Tiny runs with fast-path switches on, and the check that one trains like the single-process reference."""

from __future__ import annotations

from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch.distributed._composable import checkpoint

from mimo.models.layers import SelfAttention
from mimo.models.multimodal import MimoModel
from mimo.perf.apply import ChunkedLMLoss
from mimo.train.trainer import Trainer
from tests.support.parity import rel_diff, trainer_steps
from tests.support.tiny_run import tiny_config

RTOL = 1e-5
STEPS = 2
LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
# heads 4 over kv_heads 2: grouped-query attention that tp2 still splits; 2 LM layers for the pipeline's 2 stages.
# eps well above the gradients keeps Adam's first update proportional to them: with 1e-8 it is lr * sign(g),
# which turns float noise in a near-zero gradient into +-lr before the second step.
MODEL = ["--model.llm.layers=2", "--model.llm.heads=4", "--model.llm.kv_heads=2", "--optim.eps=1e-2"]
LAYOUTS = {
    "tp2_sp": (2, [f"{LANG}.tp=2", f"{LANG}.sequence_parallel=true", f"{IMG}.tp=2"]),
    "cp2_tp2": (4, [f"{LANG}.cp=2", f"{LANG}.tp=2", f"{LANG}.sequence_parallel=true", f"{IMG}.tp=2"]),
    "fsdp2": (2, [f"{LANG}.fsdp=true", f"{IMG}.fsdp=true"]),
    "fan_in4": (4, [f"{LANG}.tp=2"]),
    "pipeline3": (3, [f"{IMG}.offset=0", f"{IMG}.size=1", f"{LANG}.offset=1", f"{LANG}.size=2", f"{LANG}.pp=2",
                      "--parallel.microbatches=2"]),
}


SWITCHES = {
    "compile": ["--perf.compile=true", "--perf.compile_backend=aot_eager"],
    "chunked_loss": ["--perf.chunked_loss=true"],
    "fuse_qkv": ["--perf.fuse_qkv=true"],
    "checkpointing": ['--perf.activation_checkpointing=["language", "images"]'],
}


def train_tiny(out: Path, *overrides: str) -> tuple[list[float], list[dict[str, torch.Tensor]], dict[str, int]]:
    """Losses and gradients of STEPS steps, and what of the fast paths this rank's model runs."""
    trainer = Trainer(tiny_config(out, *MODEL, *overrides))
    counters["stats"].clear()
    counters["graph_break"].clear()
    losses, grads = trainer_steps(trainer, STEPS)
    return losses, grads, installed(trainer.model)


def installed(model: MimoModel) -> dict:
    """Compiled graphs and graph breaks since the run began, the loss function, fused and checkpointed
    attention blocks: the test would pass on a switch that installed nothing."""
    attention = [m for m in model.modules() if isinstance(m, SelfAttention)]
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sorted(counters["graph_break"]),
            "chunked_loss": int(isinstance(model.runtime.loss_fn, ChunkedLMLoss)),
            "fused": sum(m.fused_qkv for m in attention),
            "checkpointed": sum(checkpoint.state(block) is not None for block in model.modules())}


def assert_trains_like_reference(what: str, run: tuple, reference: tuple) -> None:
    (losses, grads), (ref_losses, ref_grads) = run, reference
    assert len(losses) == len(ref_losses) == STEPS, what
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= RTOL * abs(b), f"{what} step {step}: loss {a} vs single-process {b}"
    for step, (got, ref) in enumerate(zip(grads, ref_grads)):
        assert got.keys() == ref.keys(), f"{what} step {step}: gradient names differ"
        for name, g in got.items():
            if name.endswith("k_proj.bias") and "vit" in name:
                # A ViT key bias shifts every score of a query alike (no rotary positions), so softmax cancels
                # it: its true gradient is zero and both runs hold rounding noise, small against the weight's.
                scale = ref[name.replace("bias", "weight")].abs().max()
                assert max(g.abs().max(), ref[name].abs().max()) <= RTOL * scale, f"{what} step {step}: {name}"
                continue
            assert rel_diff(g, ref[name]) <= RTOL, \
                f"{what} step {step}: gradient {name} off by {rel_diff(g, ref[name]):.2e} relative"
