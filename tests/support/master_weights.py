"""Tiny runs with fp32 master weights under a layout, and the tolerances they are held to."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from mimo.train.trainer import Trainer
from tests.support.tiny_run import tiny_config

STEPS = 3
LOSS_RTOL = 5e-4
MASTER_OF_MOVE = 0.05


LANG, IMG = "--parallel.modules.language", "--parallel.modules.images"
MODEL = ["--model.llm.layers=2", "--model.llm.heads=4", "--model.llm.kv_heads=2", "--optim.eps=1e-2"]
MASTER = ["--precision.master_weights=true", "--precision.dtype=bfloat16"]


def full_master_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Collective: every parameter's fp32 master weights, whole (gathered over its data lanes, then over TP by
    the plan), on rank 0; the model's parameters point at them afterwards (the run is over)."""
    for _, opt in trainer.optimizer.parts:
        flat = opt.master
        if opt.group is not None:
            flat = torch.empty(opt.weight.numel(), dtype=torch.float32, device=opt.master.device)
            dist.all_gather_into_tensor(flat, opt.master, group=opt.group)
        for p in opt.params:
            off = p.data.storage_offset()
            p.data = flat[off:off + p.numel()].view_as(p).clone()
    return trainer.plan.gather_full(trainer.model)


def train_with_masters(out: Path, *overrides: str) -> dict:
    """Losses of STEPS steps; with master_weights the master weights and each part's shard fraction."""
    trainer = Trainer(tiny_config(out, *MODEL, *overrides))
    initial = {n: p.detach().float().numpy().copy() for n, p in trainer.model.named_parameters()} \
        if trainer.world == 1 else {}
    losses = [trainer.train_step(step)["loss"] for step in range(STEPS)]
    if not trainer.cfg.precision.master_weights:
        return {"losses": losses}
    shards = [(name, opt.master.numel() / opt.weight.numel()) for name, opt in trainer.optimizer.parts]
    fsdp = {name: (sum(p.to_local().numel() for p in ps), sum(p.numel() for p in ps),
                   {str(p.dtype) for p in ps} | {str(v.dtype) for st in opt.state.values() for k, v in st.items()
                                                if k != "step"})
            for name, opt in trainer.optimizer.optimizers.items()
            for ps in [[p for g in opt.param_groups for p in g["params"]]]}
    master = {n: t.numpy() for n, t in full_master_weights(trainer).items()}
    return {"losses": losses, "master": master, "shards": shards, "fsdp": fsdp, "initial": initial}


# the MoE model and the expert layout that the master weights are tested on beside expert parallelism
MOE = ["--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_top_k=2"]
EP_FSDP = [f"{LANG}.ep=2", f"{LANG}.fsdp=true"]


# a master-weights run of 6 steps that saves every 2, and the checkpoint it resumes from
MASTER_SAVES = ["--precision.dtype=bfloat16", "--precision.master_weights=true", "--train.steps=6",
                "--checkpoint.save_every=2"]
STEP4 = Path("tiny") / "checkpoints" / "step_00000004"
