"""`precision.master_weights`: MimoOptimizer's contract over MasterAdamW (bf16 weights, fp32 master weights and
fp32 moments, one fused update pass).

One MasterAdamW per module and weight-decay group (matrices decayed, vectors not, as MimoOptimizer groups
them), each with the module's learning rate; the schedule's learning rate lives on the device
(`begin(step)` writes it before the step's work is queued).

On a data-parallel layout (`groups`: a module's (parameters, data-lane group) pairs, from
ParallelPlan.master_state_groups) the module's gradients arrive already summed over each group (the plan's
GradReducers), and the MasterAdamW of each pair keeps the fp32 master weights and moments of its own 1/N of
that pair's flat buffer only (ZeRO-1): each rank updates its shard and all-gathers the new bf16 weights, a
collective over the group. An expert-parallel LM has two pairs: its dense parameters over all its data
lanes, its experts over their edp group (the ranks that hold the same experts), so no shard mixes experts
of different ranks. The global norm is then
`norm_sq_reduce` over the ranks' per-module shares, as in MimoOptimizer.

Checkpoints hold no torch optimizer state under this mode (`optimizers` is empty); `master_state(rank)` is
this rank's fp32 master weights and moments (its shards) and each parameter's step count, saved under
`master.rank<N>` beside the bf16 weights (mimo.train.checkpoint), and loaded back on the layout they were written
with.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch
from torch import nn
from torch.distributed import ProcessGroup

from mimo.config.schema import OptimConfig
from mimo.parallel.data import NormReducer
from mimo.perf.master_adamw import MasterAdamW
from mimo.train.optim import StepOptimizer, local_grad_sq, lr_factor, param_groups, torch_state_tensors


class MasterOptimizer(StepOptimizer):
    """Per module and decay group, a MasterAdamW; the global gradient norm, clipping and the skip on a
    non-finite norm as in MimoOptimizer. `groups` maps a
    module to the (parameters, group) pairs its master state is sharded over, which together hold all its
    trainable parameters (absent or empty: not sharded);
    `norm_sq_reduce` (with groups) makes the global norm from every rank's per-module shares. A module in
    `fsdp` (FSDP2 with mixed precision, mimo.parallel.data.BF16_COMPUTE) keeps its fp32 sharded parameters as
    the master weights and takes torch's AdamW over them (fp32 moments, sharded alike; checkpointed per
    parameter as MimoOptimizer's are, in `optimizers`)."""

    def __init__(self, modules: dict[str, nn.Module], cfg: OptimConfig, total_steps: int, grad_table: bool = False,
                 compile: bool = False,
                 groups: dict[str, list[tuple[list[nn.Parameter], ProcessGroup]]] | None = None,
                 norm_sq_reduce: NormReducer | None = None, fsdp: Collection[str] = ()):
        self.cfg, self.total_steps = cfg, total_steps
        self.norm_sq_reduce = norm_sq_reduce
        self.parts: list[tuple[str, MasterAdamW]] = []
        self.optimizers: dict[str, torch.optim.AdamW] = {}  # FSDP2 modules' (the others': master_state)
        for name, mod in modules.items():
            lr = cfg.module_lr.get(name, cfg.lr)
            if name in fsdp:
                decay_groups = param_groups(mod, cfg.weight_decay)
                if decay_groups:
                    self.optimizers[name] = torch.optim.AdamW(decay_groups, lr=lr, betas=(cfg.beta1, cfg.beta2),
                                                              eps=cfg.eps)
                continue
            for params, group in (groups or {}).get(name) or [(list(mod.parameters()), None)]:
                self._add_parts(name, mod, {id(p) for p in params}, group, lr, grad_table, compile)
        self.module_params: dict[str, list[nn.Parameter]] = {}
        for name, opt in self.parts:
            self.module_params.setdefault(name, []).extend(opt.params)
        for name, torch_opt in self.optimizers.items():
            self.module_params[name] = [p for g in torch_opt.param_groups for p in g["params"]]
        self.params = [p for ps in self.module_params.values() for p in ps]

    def _add_parts(self, name: str, mod: nn.Module, ids: set[int], group: ProcessGroup | None, lr: float,
                   grad_table: bool, compile: bool) -> None:
        """One MasterAdamW per decay group of `mod`'s parameters in `ids`, sharded over `group`."""
        cfg = self.cfg
        for decay_group in param_groups(mod, cfg.weight_decay):
            params = [p for p in decay_group["params"] if id(p) in ids]
            if not params:
                continue
            opt = MasterAdamW(params, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                              weight_decay=decay_group["weight_decay"], compile=compile, grad_table=grad_table,
                              group=group, summed_grads=group is not None)
            self.parts.append((name, opt))

    def master_state(self, rank: int) -> dict:
        """This rank's optimizer state, the tensors themselves (a checkpoint loads into them in place):
        {"rank<N>": {"<part>": MasterAdamW.state()}}."""
        parts = {str(i): opt.state() for i, (_, opt) in enumerate(self.parts)}
        return {f"rank{rank:05d}": parts} if parts else {}

    def state_tensors(self, name: str) -> list[torch.Tensor]:
        """Module `name`'s optimizer state on this rank: its parts' master weights and moments, or its FSDP2
        AdamW's moments."""
        parts = [t for n, opt in self.parts if n == name for t in (opt.master, opt.exp_avg, opt.exp_avg_sq)]
        return parts + torch_state_tensors(self.optimizers.get(name))

    def begin(self, step: int) -> None:
        """Write step `step`'s learning rates to the device, before the step's forward is queued."""
        factor = lr_factor(step, self.total_steps, self.cfg)
        for name, opt in self.parts:
            opt.lr.fill_(self.cfg.module_lr.get(name, self.cfg.lr) * factor)
        for name, torch_opt in self.optimizers.items():
            for g in torch_opt.param_groups:
                g["lr"] = self.cfg.module_lr.get(name, self.cfg.lr) * factor

    def grad_norm(self) -> torch.Tensor:
        """The global L2 norm of every gradient, in fp32, on the device (no host sync); collective with
        `norm_sq_reduce`."""
        if self.norm_sq_reduce is not None:
            parts = {name: local_grad_sq(ps) for name, ps in self.module_params.items()}
            return self.norm_sq_reduce(parts).sqrt()
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.params[0].device)
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))

    def step(self, step: int) -> tuple[bool, float, float]:
        """MimoOptimizer.step's contract: clip by the global norm, update, (stepped, grad_norm, lr); a non-finite
        norm skips the step."""
        norm_f = float(self.grad_norm())
        if not math.isfinite(norm_f):
            self.zero_grad()
            return False, norm_f, self.lr(step)
        if self.cfg.clip > 0 and norm_f > self.cfg.clip:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(self.cfg.clip / (norm_f + 1e-6))
        for _, opt in self.parts:
            opt.step()
        for torch_opt in self.optimizers.values():
            torch_opt.step()
        self.zero_grad()
        return True, norm_f, self.lr(step)

    def zero_grad(self) -> None:
        for _, opt in self.parts:
            opt.zero_grad()
        for torch_opt in self.optimizers.values():
            torch_opt.zero_grad(set_to_none=True)
