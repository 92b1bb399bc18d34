"""Per-module optimizers, the global gradient norm, clipping and the learning-rate schedule.

One AdamW per module (language model, each modality) so that modules can have their own learning
rate, be frozen, and later live on their own process groups. The gradient norm is global across
modules, and clipping uses it; a non-finite norm skips the step for every module.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from mimo.config import OptimConfig

NormReducer = Callable[[torch.Tensor], torch.Tensor]


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


class MimoOptimizer:
    """AdamW per module with a shared schedule, global-norm clipping and a skip on non-finite norms.

    `norm_sq_reduce` turns this rank's sum of squared gradient entries into the global one (identity
    on one process; parallel code passes a reduction that counts sharded parameters once).
    """

    def __init__(self, modules: dict[str, nn.Module], cfg: OptimConfig, total_steps: int,
                 fused: bool = False, norm_sq_reduce: NormReducer | None = None):
        self.cfg = cfg
        self.total_steps = total_steps
        self.norm_sq_reduce = norm_sq_reduce or (lambda x: x)
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
        self.params = [p for opt in self.optimizers.values() for g in opt.param_groups for p in g["params"]]

    def grad_norm(self) -> torch.Tensor:
        """Global L2 norm of all gradients of all modules (a collective when a reducer is set)."""
        sq = torch.zeros((), dtype=torch.float32, device=self.params[0].device if self.params else "cpu")
        for p in self.params:
            if p.grad is not None:
                sq = sq + p.grad.detach().float().pow(2).sum()
        return self.norm_sq_reduce(sq).sqrt()

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

    def state_dict(self) -> dict[str, dict]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])
