"""`perf.encoder_offload` beside a pipelined LM changes where the encoder's weights and optimizer states wait
during the LM's pipeline, never a value.

The colocated pipelined plan is driven directly on CPU (the gate keeps the key to GPUs, where it saves memory;
the move itself is the same code on any device): images dp4 + LM pp2 x dp2 on 4 ranks, plain and FSDP2-sharded,
with and without the encoder's activation checkpointing, and bf16 master weights (MasterAdamW's flat master
weights and moments), 3 steps of AdamW from one seed on the same batches.
A probe on every LM module's forward reads the bytes the encoder's weights and optimizer states hold on the
device; the offloaded run must hold none there during the LM phase and hold them all after the step, and its
losses, every gradient and the weights after the steps must equal the run without offload bitwise.
"""

import contextlib

import pytest
import torch

from mimo.config.schema import ModuleLayoutConfig
from mimo.models.build import build_model
from mimo.models.multimodal import modules_by_name
from mimo.parallel.pipeline.offload import local_tensors
from mimo.parallel.plan import ParallelPlan
from mimo.perf.apply import apply_fast_paths
from mimo.train.master_optim import MasterOptimizer
from mimo.train.optim import MimoOptimizer
from tests.support.configs import image_text_batch, tiny_llm, tiny_vit, tiny_vlm
from tests.support.dist import run_distributed
from tests.support.pipeline_case import IMG, MICRO, S

IMAGES = [0, 0, 3, 1, 2, 1, 0, 3, 0, 0, 0, 0, 1, 2, 0, 0]
STEPS = 3


def _device_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in local_tensors(tensors))


def _optimizer(cfg, model: torch.nn.Module, plan: ParallelPlan):
    """The trainer's optimizer: MasterOptimizer sharded as the plan says under master weights, else MimoOptimizer."""
    modules = modules_by_name(model)
    if cfg.precision.master_weights:
        return MasterOptimizer(modules, cfg.optim, 10, groups={n: plan.master_state_groups(n) for n in modules},
                               norm_sq_reduce=plan.norm_sq_reduce, fsdp=plan.fsdp_modules())
    return MimoOptimizer(modules, cfg.optim, 10, norm_sq_reduce=plan.norm_sq_reduce)


def _run(rank: int, world: int, fsdp: bool, recompute: bool, master: bool, offload: bool) -> tuple:
    """STEPS steps on this rank: (losses, gradients and weights gathered on rank 0, the encoder's device bytes seen
    at each LM module's forward, those after each step)."""
    modules = {"images": ModuleLayoutConfig(fsdp=fsdp), "language": ModuleLayoutConfig(pp=2, fsdp=fsdp)}
    cfg = tiny_vlm(tiny_llm(layers=3, init_std=0.1), tiny_vit(layers=2, init_std=0.1), IMG, modules, MICRO,
                   len(IMAGES))
    cfg.perf.activation_checkpointing = ["images"] if recompute else []
    cfg.perf.encoder_offload = ["images"] if offload else []
    cfg.precision.dtype, cfg.precision.master_weights = ("bfloat16", True) if master else ("float32", False)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(model, lambda m, runtime: apply_fast_paths(cfg, m, runtime))
    opt = _optimizer(cfg, model, plan)
    plan.pipeline.offload_states(opt.state_tensors)
    sub = model.modality_submodules["images"]
    encoder = [*sub.encoders.parameters(), *sub.input_projections.parameters()]
    held = lambda: _device_bytes(encoder + opt.state_tensors("images"))
    during: list[int] = []
    for m in model.language_model.modules():
        m.register_forward_pre_hook(lambda *_: during.append(held()))
    losses, grads, after = [], [], []
    for step in range(STEPS):
        batch = image_text_batch(torch.tensor(IMAGES), S, IMG, torch.Generator().manual_seed(7 + step))
        losses.append(plan.pipeline.train_step(model, batch, torch.device("cpu"), contextlib.nullcontext).loss)
        plan.finalize_grads(model)
        grads.append(plan.gather_full(model, grads=True))
        assert opt.step(step)[0]
        after.append(held())
    return losses, grads, plan.gather_full(model), during, after


def _compare(rank: int, world: int, *case: bool) -> None:
    base = _run(rank, world, *case, False)
    moved = _run(rank, world, *case, True)
    assert base[3] and min(base[3]) > 0, "without offload the encoder stays on the device"
    assert moved[3] and max(moved[3]) == 0, f"rank {rank}: encoder bytes on the device in the LM phase {moved[3]}"
    assert moved[4] == base[4] and min(base[4]) > 0, "the encoder's weights and states came back whole"
    assert moved[0] == base[0], f"losses {moved[0]} vs {base[0]}"
    for step, (got, ref) in enumerate(zip(moved[1], base[1], strict=True)):
        for name in ref:
            assert torch.equal(got[name], ref[name]), f"step {step}: gradient of {name}"
    for name in base[2]:
        assert torch.equal(moved[2][name], base[2][name]), f"weight {name}"


@pytest.mark.parametrize("fsdp,recompute,master", [(False, False, False), (True, True, False), (False, False, True)])
def test_encoder_offload_moves_the_encoder_out_during_the_lm_phase_and_changes_nothing(fsdp, recompute, master):
    run_distributed(_compare, 4, fsdp, recompute, master, timeout=300)
