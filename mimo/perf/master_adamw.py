"""AdamW over bf16 model weights with fp32 master weights and fp32 moments, in one fused pass.

The model holds only bf16 weights, so forward and backward read half the bytes and no autocast cast
runs each step, while the update keeps fp32 precision (the same contract as autocast over fp32 weights).
Master weights and both moments live in flat fp32 buffers, and every bf16 weight and its `.grad` are
views of two flat bf16 buffers, so the update is one elementwise pass over a few large tensors (one
kernel per chunk when compiled, which also writes the new bf16 weights) instead of hundreds of small
ones. The step count and learning rate live on the device, so a step never makes the host wait for
the GPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

_ALIGN = 64  # elements: every view starts 128-byte aligned, as vectorised kernels like


def adamw_update(master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, grad: torch.Tensor,
                 weight: torch.Tensor, step: torch.Tensor, lr: torch.Tensor, beta1: float, beta2: float, eps: float,
                 weight_decay: float) -> None:
    """One AdamW update of fp32 tensors in place, torch.optim.AdamW's formula; `grad` may be bf16. The
    updated master weights are also written, rounded, to `weight` (the model's low-precision copy)."""
    g = grad.float()
    master.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1 ** step)
    denom = exp_avg_sq.sqrt() / (1 - beta2 ** step).sqrt() + eps
    master.sub_(step_size * exp_avg / denom)
    weight.copy_(master)


class MasterAdamW:
    """Turns the given parameters into bf16 (their current values become the fp32 master weights).

    Call `step()` after backward and `zero_grad()` before the next one; gradients accumulate in place
    in the flat buffer, so `.grad` must not be set to None by other code. `chunk` bounds the elements
    of one update call (and the temporaries of the uncompiled update).
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, dtype: torch.dtype = torch.bfloat16,
                 compile: bool = False, chunk: int = 1 << 28):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("MasterAdamW got no trainable parameters")
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        device = self.params[0].device
        offsets, total = [], 0
        for p in self.params:
            offsets.append(total)
            total += -(-p.numel() // _ALIGN) * _ALIGN
        self.master = torch.zeros(total, dtype=torch.float32, device=device)
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.grad = torch.zeros(total, dtype=dtype, device=device)
        self.weight = torch.zeros(total, dtype=dtype, device=device)
        self.master_views = [self.master[off:off + p.numel()].view_as(p) for p, off in zip(self.params, offsets)]
        with torch.no_grad():
            for p, off, master in zip(self.params, offsets, self.master_views):
                master.copy_(p)
                weight = self.weight[off:off + p.numel()].view_as(p)
                weight.copy_(p)
                p.data = weight
                p.grad = self.grad[off:off + p.numel()].view_as(p)
        self.step_count = torch.zeros((), dtype=torch.float32, device=device)
        self.lr = torch.full((), lr, dtype=torch.float32, device=device)
        self.slices = [slice(s, min(s + chunk, total)) for s in range(0, total, chunk)]
        self.update = torch.compile(adamw_update) if compile else adamw_update

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        for s in self.slices:
            self.update(self.master[s], self.exp_avg[s], self.exp_avg_sq[s], self.grad[s], self.weight[s],
                        self.step_count, self.lr, self.beta1, self.beta2, self.eps, self.weight_decay)

    def zero_grad(self) -> None:
        self.grad.zero_()
