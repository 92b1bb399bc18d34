"""Per-module optimizers, the global gradient norm, clipping and the learning-rate schedule.

One AdamW per module (language model, each modality) so that modules can have their own learning
rate, be frozen, and later live on their own process groups. The gradient norm is global across
modules, and clipping uses it; a non-finite norm skips the step for every module. `StepOptimizer` is what
the trainer, its fault handling and its checkpoints ask of an optimizer: MimoOptimizer here, MasterOptimizer
(mimo.train.master_optim) under precision.master_weights.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn

from mimo.config.schema import OptimConfig
from mimo.parallel.data import REPLICAS, NormReducer


def local_grad_sq(params: list[torch.Tensor]) -> torch.Tensor:
    """This rank's share of the squared gradient norm: sum of squares, each divided by its replica count."""
    sq = torch.zeros((), dtype=torch.float32, device=params[0].device if params else "cpu")
    for p in params:
        g = p.grad
        if g is None:
            continue
        g = g.to_local() if hasattr(g, "to_local") else g
        sq = sq + g.detach().float().pow(2).sum() / getattr(p, REPLICAS, 1)
    return sq


def param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only; norms, biases and other vectors are not decayed."""
    decay, no_decay = [], []
    for p in module.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def lr_factor(step: int, total: int, cfg: OptimConfig) -> float:
    """Linear warm-up, then cosine / linear decay to `min_lr_ratio`, or constant."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant" or total <= cfg.warmup_steps:
        return 1.0
    t = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    lo = cfg.min_lr_ratio
    if cfg.schedule == "linear":
        return lo + (1 - lo) * (1 - t)
    return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * t))


def torch_state_tensors(opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The tensors of `opt`'s per-parameter state, step counts (0-d) left out; none without `opt`."""
    if opt is None:
        return []
    return [v for state in opt.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()]


class StepOptimizer(Protocol):
    """The one optimizer protocol. Every rank calls `begin(step)` before the step's forward and then `step(step)`
    (collective where gradients are sharded or reduced) or, for a step every rank skips, `zero_grad()`."""

    cfg: OptimConfig
    total_steps: int
    optimizers: dict[str, torch.optim.Optimizer]
    """By module name, the torch optimizers whose state a checkpoint saves per parameter."""

    def begin(self, step: int) -> None:
        """Before step `step`'s forward is queued: anything the update reads on the device (its learning rate)."""

    def step(self, step: int) -> tuple[bool, float, float]:
        """Clip by the global gradient norm and update every module, or skip a step whose norm is not finite; then
        drop the gradients. Returns (stepped, grad_norm, lr)."""

    def zero_grad(self) -> None:
        """Drop every gradient."""

    def lr(self, step: int) -> float:
        """The schedule's learning rate (optim.lr's) at `step`."""
        return lr_factor(step, self.total_steps, self.cfg) * self.cfg.lr

    def state_tensors(self, name: str) -> list[torch.Tensor]:
        """Module `name`'s optimizer state tensors on this rank (perf.encoder_offload moves them)."""

    def master_state(self, rank: int) -> dict:
        """The state kept outside `optimizers` that a checkpoint saves and loads in place, under keys unique to
        `rank`; {} where there is none."""


class MimoOptimizer(StepOptimizer):
    """AdamW per module with a shared schedule, global-norm clipping and a skip on non-finite norms.

    `norm_sq_reduce` turns this rank's per-module squared-norm shares (see `local_grad_sq`) into the
    global squared norm: their sum on one process; parallel code all-reduces each module's share over
    that module's ranks.
    """

    def __init__(self, modules: dict[str, nn.Module], cfg: OptimConfig, total_steps: int,
                 fused: bool = False, norm_sq_reduce: NormReducer | None = None):
        self.cfg = cfg
        self.total_steps = total_steps
        self.norm_sq_reduce = norm_sq_reduce or (lambda parts: sum(parts.values(), torch.zeros(())))
        self.optimizers: dict[str, torch.optim.AdamW] = {}
        self.base_lr: dict[str, float] = {}
        for name, mod in modules.items():
            groups = param_groups(mod, cfg.weight_decay)
            if not groups:
                continue
            lr = cfg.module_lr.get(name, cfg.lr)
            self.base_lr[name] = lr
            self.optimizers[name] = torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                                      fused=fused or None)
        self.module_params = {name: [p for g in opt.param_groups for p in g["params"]]
                              for name, opt in self.optimizers.items()}
        self.params = [p for ps in self.module_params.values() for p in ps]

    def begin(self, step: int) -> None:
        """Nothing before a step's forward: the learning rate is set in `step`."""

    def grad_norm(self) -> torch.Tensor:
        """Global L2 norm of all gradients of all modules (a collective when a reducer is set)."""
        parts = {name: local_grad_sq(ps) for name, ps in self.module_params.items()}
        return self.norm_sq_reduce(parts).sqrt()

    def step(self, step: int) -> tuple[bool, float, float]:
        """Clip by the global norm, set the LR, step every module. Returns (stepped, grad_norm, lr)."""
        norm = self.grad_norm()
        norm_f = float(norm)
        factor = lr_factor(step, self.total_steps, self.cfg)
        if not math.isfinite(norm_f):
            self.zero_grad()
            return False, norm_f, factor * self.cfg.lr
        if self.cfg.clip > 0 and norm_f > self.cfg.clip:
            scale = self.cfg.clip / (norm_f + 1e-6)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        for name, opt in self.optimizers.items():
            for g in opt.param_groups:
                g["lr"] = self.base_lr[name] * factor
            opt.step()
        self.zero_grad()
        return True, norm_f, factor * self.cfg.lr

    def zero_grad(self) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    def state_tensors(self, name: str) -> list[torch.Tensor]:
        """Module `name`'s optimizer state on this rank: each parameter's moments (none before its first step)."""
        return torch_state_tensors(self.optimizers.get(name))

    def master_state(self, rank: int) -> dict:
        """State outside torch's optimizers for checkpoints: none here (MasterOptimizer's fp32 shards)."""
        return {}
