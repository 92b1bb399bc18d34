"""AdamW over bf16 model weights with fp32 master weights and fp32 moments, in one fused pass.

The model holds only bf16 weights, so forward and backward read half the bytes and no autocast cast
runs each step, while the update keeps fp32 precision (the same contract as autocast over fp32 weights).
Master weights and both moments live in flat fp32 buffers, and every bf16 weight and (after backward)
its `.grad` are views of two flat bf16 buffers, so the update is one elementwise pass over a few large
tensors (one kernel per chunk when compiled, which also writes the new bf16 weights) instead of hundreds
of small ones. The step count and learning rate live on the device, so a step never makes the host wait for
the GPU.

With `in_backward`, each parameter's update runs as soon as autograd has its gradient (the moment the
gradient is final when one backward makes a step and nothing clips): the fresh gradient is read where
autograd left it, so no flat gradient buffer exists and nothing is copied, and on CUDA the updates run on a
side stream, under the rest of the backward pass, instead of after it.

Data parallelism (ZeRO-1): given a process group of N ranks, the flat buffers are split into N equal
shards and each rank keeps master weights and moments for its own shard only (12 of the 16 bytes per
parameter that AdamW holds, divided by N), while every rank still holds the full bf16 weights and
gradients its model needs. A step reduce-scatters the gradients (each rank receives the sum over
ranks of its shard), updates its shard with the mean, and all-gathers the new bf16 weights.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from mimo.parallel.comm import all_gather_single, reduce_scatter_single

_ALIGN = 64  # elements: every view starts 128-byte aligned, as vectorised kernels like


def adamw_update(master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, grad: torch.Tensor,
                 weight: torch.Tensor, step: torch.Tensor, lr: torch.Tensor, beta1: float, beta2: float, eps: float,
                 weight_decay: float, grad_scale: float = 1.0) -> None:
    """One AdamW update of fp32 tensors in place, torch.optim.AdamW's formula, on the gradient
    `grad * grad_scale` (`grad` may be bf16; the scale turns a sum over ranks into their mean in fp32).
    The updated master weights are also written, rounded, to `weight` (the model's low-precision copy)."""
    g = grad.float()
    if grad_scale != 1.0:
        g = g * grad_scale
    master.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1 ** step)
    denom = exp_avg_sq.sqrt() / (1 - beta2 ** step).sqrt() + eps
    master.sub_(step_size * exp_avg / denom)
    weight.copy_(master)


def _into_view(p: torch.Tensor, view: torch.Tensor) -> None:
    """Make `view` (a part of the flat gradient buffer) `p`'s gradient: copy a fresh `.grad` into it. Run
    after autograd has accumulated; a gradient already in the view (a later micro-batch) is left alone."""
    if p.grad is not view:
        view.copy_(p.grad)
        p.grad = view


class MasterAdamW:
    """Turns the given parameters into bf16 (their current values become the fp32 master weights).

    Call `step()` after backward and `zero_grad()` before the next one. After backward each `.grad` is
    a view of one flat buffer (so clipping or inspecting gradients works as usual). With `fresh_grads`
    (default), `zero_grad()` does not fill that buffer with zeros: it sets every `.grad` to None,
    autograd then hands each parameter its fresh gradient (no addition into zeros), and a hook run right
    after copies it into the parameter's view and puts the view back as `.grad`. A second backward
    before `step()` adds into the views, as autograd always accumulates. A gradient assigned by hand is
    copied in by `step()`, and the view of a parameter that got none is zeroed there (it steps on zeros).
    Without `fresh_grads`, `.grad` is the view from the start and `zero_grad()` zeroes the whole buffer,
    so autograd adds every gradient into zeros. The hooks stay on the parameters: build one MasterAdamW
    per set of parameters. With `in_backward` (one process only), each parameter is updated in its hook
    instead, from the fresh gradient, which is then dropped (`.grad` stays None): one backward per step,
    and `step()` only updates parameters that got no gradient (on zeros) and makes the current stream wait
    for the updates (call it before the weights are read again). `side_stream=False` keeps the updates
    on the backward pass's stream (to measure what the overlap buys). `chunk` bounds the elements of one
    update call (and the temporaries of the uncompiled update).

    With `group` (more than one rank), `step()` is collective and takes the mean of the ranks'
    gradients (each rank's loss being a mean over its own micro-batch). Every rank must pass the same
    initial weights (e.g. a model built from the same seed): each keeps a copy of its own shard only,
    so nothing is broadcast.
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, dtype: torch.dtype = torch.bfloat16,
                 compile: bool = False, chunk: int = 1 << 28, group: ProcessGroup | None = None,
                 fresh_grads: bool = True, in_backward: bool = False, side_stream: bool = True):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("MasterAdamW got no trainable parameters")
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        ranks = dist.get_world_size(group) if group is not None else 1
        if in_backward and ranks > 1:
            raise ValueError("MasterAdamW(in_backward=True) updates each parameter from its local gradient, so it "
                             "cannot take a mean over ranks: use in_backward=False with a process group")
        self.group = group if ranks > 1 else None
        device = self.params[0].device
        offsets, total = [], 0
        for p in self.params:
            offsets.append(total)
            total += -(-p.numel() // _ALIGN) * _ALIGN
        total = -(-total // (ranks * _ALIGN)) * ranks * _ALIGN  # equal shards, each starting aligned
        size = total // ranks
        start = (dist.get_rank(group) if self.group is not None else 0) * size
        self.grad = torch.zeros(0 if in_backward else total, dtype=dtype, device=device)
        self.weight = torch.zeros(total, dtype=dtype, device=device)
        # this rank's shard: fp32 state of its elements; their summed gradients land in grad_shard
        self.master = torch.zeros(size, dtype=torch.float32, device=device)
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.weight_shard = self.weight[start:start + size]
        self.grad_shard = self.grad[start:start + size] if self.group is None else torch.zeros_like(self.weight_shard)
        with torch.no_grad():
            for p, off in zip(self.params, offsets):
                lo, hi = max(off, start), min(off + p.numel(), start + size)
                if lo < hi:  # the part of p in this rank's shard, copied before p turns bf16
                    self.master[lo - start:hi - start].copy_(p.detach().reshape(-1)[lo - off:hi - off])
                weight = self.weight[off:off + p.numel()].view_as(p)
                weight.copy_(p)
                p.data = weight
                p.grad = None
        self.grad_scale = 1.0 / ranks
        self.step_count = torch.zeros((), dtype=torch.float32, device=device)
        self.lr = torch.full((), lr, dtype=torch.float32, device=device)
        self.slices = [slice(s, min(s + chunk, size)) for s in range(0, size, chunk)]
        self.update = torch.compile(adamw_update, dynamic=in_backward) if compile else adamw_update
        self.fresh_grads, self.in_backward = fresh_grads, in_backward
        if in_backward:
            self.spans = [slice(off, off + p.numel()) for p, off in zip(self.params, offsets)]
            # on CUDA the updates get a stream of their own, to run under the rest of the backward pass
            self.stream = torch.cuda.Stream(device) if side_stream and device.type == "cuda" else None
            self.updated: list[torch.Tensor] = []  # this step's gradients, alive until the side stream is done
            self.pending = set(range(len(self.params)))  # parameters not updated yet this step
            for i, p in enumerate(self.params):
                p.register_post_accumulate_grad_hook(functools.partial(self._update_in_backward, i))
            return
        self.grad_views = [self.grad[off:off + p.numel()].view_as(p) for p, off in zip(self.params, offsets)]
        for p, view in zip(self.params, self.grad_views):
            if fresh_grads:
                p.register_post_accumulate_grad_hook(functools.partial(_into_view, view=view))
            else:
                p.grad = view

    def _update_one(self, i: int, grad: torch.Tensor) -> None:
        """AdamW on parameter i's span of the flat state with `grad` (in_backward), on the side stream; the
        first update of a step counts the step."""
        if len(self.pending) == len(self.params):
            self.step_count += 1
        self.pending.discard(i)
        s = self.spans[i]
        self.update(self.master[s], self.exp_avg[s], self.exp_avg_sq[s], grad.reshape(-1), self.weight[s],
                    self.step_count, self.lr, self.beta1, self.beta2, self.eps, self.weight_decay)

    @torch.no_grad()
    def _update_in_backward(self, i: int, p: torch.Tensor) -> None:
        if i not in self.pending:
            raise RuntimeError("MasterAdamW(in_backward=True) got a second gradient for a parameter before step(): "
                               "it takes one backward per step (no gradient accumulation)")
        grad, p.grad = p.grad, None
        if self.stream is None:
            self._update_one(i, grad)
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        self.updated.append(grad)
        with torch.cuda.stream(self.stream):
            self._update_one(i, grad)

    @torch.no_grad()
    def step(self) -> None:
        """Collective with a group: the gradients are reduce-scattered in the flat buffer's dtype (bf16 by
        default: half the bytes of fp32, and the sum rounds about as coarsely as the bf16 gradients
        already are), scaled to their mean in fp32, and the new weights all-gathered from each shard.
        With in_backward: the parameters that got no gradient step on zeros, and the current stream waits
        for the updates."""
        if self.in_backward:
            self._finish_in_backward()
            return
        for p, view in zip(self.params, self.grad_views):
            if p.grad is None:
                view.zero_()
            elif p.grad is not view:
                _into_view(p, view)
        if self.group is not None:
            reduce_scatter_single(self.grad_shard, self.grad, group=self.group)
        self.step_count += 1
        for s in self.slices:
            self.update(self.master[s], self.exp_avg[s], self.exp_avg_sq[s], self.grad_shard[s],
                        self.weight_shard[s], self.step_count, self.lr, self.beta1, self.beta2, self.eps,
                        self.weight_decay, self.grad_scale)
        if self.group is not None:
            all_gather_single(self.weight, self.weight_shard, group=self.group)

    def _finish_in_backward(self) -> None:
        if any(p.grad is not None for p in self.params):
            raise RuntimeError("MasterAdamW(in_backward=True) found a gradient set by hand; it updates each "
                               "parameter from autograd's gradient only: use in_backward=False")
        for i in sorted(self.pending):
            p = self.params[i]
            with contextlib.nullcontext() if self.stream is None else torch.cuda.stream(self.stream):
                self._update_one(i, torch.zeros_like(p))
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
        self.updated.clear()
        self.pending = set(range(len(self.params)))

    def zero_grad(self) -> None:
        if self.in_backward:
            return
        if not self.fresh_grads:
            self.grad.zero_()
            return
        for p in self.params:
            p.grad = None
