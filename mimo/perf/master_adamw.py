"""AdamW over bf16 model weights with fp32 master weights and fp32 moments, in one fused pass.

The model holds only bf16 weights, so forward and backward read half the bytes and no autocast cast
runs each step, while the update keeps fp32 precision (the same contract as autocast over fp32 weights).
Master weights and both moments live in flat fp32 buffers, and every bf16 weight and (after backward)
its `.grad` are views of two flat bf16 buffers, so the update is one elementwise pass over a few large
tensors (one kernel per chunk when compiled, which also writes the new bf16 weights) instead of hundreds
of small ones. Each parameter's step count (torch AdamW's: a parameter without a gradient is skipped) and the
learning rate live on the device, so a step never makes the host wait for the GPU; the host keeps a copy of the
counts to update neighbours with equal counts in one pass.

With `grad_table`, there is no flat gradient buffer: each gradient stays the tensor autograd made, and
one Triton kernel reads them all through a table of their addresses (`adamw_triton`), so no gradient is
copied anywhere.

Data parallelism (ZeRO-1): given a process group of N ranks, the flat buffers are split into N equal
shards and each rank keeps master weights and moments for its own shard only (12 of the 16 bytes per
parameter that AdamW holds, divided by N), while every rank still holds the full bf16 weights and
gradients its model needs. A step reduce-scatters the gradients (each rank receives the sum over
ranks of its shard), updates its shard with the mean, and all-gathers the new bf16 weights. With
`summed_grads` the caller has already summed the gradients over the group (the trainer's bucketed
all-reduce): a step updates this rank's shard from its own copy of the summed gradient, unscaled, and
all-gathers the new bf16 weights (only the fp32 state is sharded).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from mimo.parallel.comm import all_gather_single, reduce_scatter_single
from mimo.perf.adamw_triton import TableUpdate, aligned_grad
from mimo.perf.triton_support import unavailable

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


def _refuse_options(params: list[nn.Parameter], ranks: int, fresh_grads: bool, grad_table: bool) -> None:
    """MasterAdamW's refusals of arguments that cannot work together, before anything is allocated."""
    if not params:
        raise ValueError("MasterAdamW got no trainable parameters")
    if grad_table:
        why = ("a process group" if ranks > 1 else "fresh_grads=False" if not fresh_grads
               else unavailable(params[0].device))
        if why:
            raise ValueError(f"MasterAdamW(grad_table=True) cannot run with {why}: use grad_table=False (a flat "
                             f"gradient buffer)")


class MasterAdamW:
    """Turns the given parameters into bf16 (their current values become the fp32 master weights).

    Call `step()` after backward and `zero_grad()` before the next one. After backward each `.grad` is a view of one
    flat buffer (so clipping or inspecting gradients works as usual). With `fresh_grads` (default), `zero_grad()`
    does not fill that buffer with zeros: it sets every `.grad` to None, autograd then hands each parameter its
    fresh gradient (no addition into zeros), and a hook run right after copies it into the parameter's view and puts
    the view back as `.grad`. A second backward before `step()` adds into the views, as autograd always accumulates.
    A gradient assigned by hand is copied in by `step()`. A parameter whose `.grad` is None at `step()` is skipped
    as torch's AdamW skips it: its weights, moments and step count stay as they are (with `group`, every rank must
    leave the same parameters without a gradient). Without `fresh_grads`, `.grad` is the view from the start and
    `zero_grad()` zeroes the whole buffer, so autograd adds every gradient into zeros. The hooks stay on the
    parameters: build one MasterAdamW per set of parameters. `chunk` bounds the elements of one update call (and the
    temporaries of the uncompiled update). With `grad_table` (one process, fresh gradients, Triton on the device),
    `.grad` stays autograd's own tensor and the update reads it in place (see the module docstring); `compile` and
    `chunk` do not apply.

    With `group` (more than one rank), `step()` is collective and takes the mean of the ranks'
    gradients (each rank's loss being a mean over its own micro-batch); with `summed_grads` too, but it takes
    every `.grad` to be the sum over the group already (identical on every rank) and steps on it as it is,
    with no reduction. Every rank must pass the same
    initial weights (e.g. a model built from the same seed): each keeps a copy of its own shard only,
    so nothing is broadcast.
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, dtype: torch.dtype = torch.bfloat16,
                 compile: bool = False, chunk: int = 1 << 28, group: ProcessGroup | None = None,
                 fresh_grads: bool = True, grad_table: bool = False, summed_grads: bool = False):
        self.params = [p for p in params if p.requires_grad]
        ranks = dist.get_world_size(group) if group is not None else 1
        _refuse_options(self.params, ranks, fresh_grads, grad_table)
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.group = group if ranks > 1 else None
        self.summed_grads = summed_grads
        device = self.params[0].device
        offsets, size = self._flatten(dtype, ranks, grad_table)
        self.table = TableUpdate([p.numel() for p in self.params], offsets, device) if grad_table else None
        self.grad_views = [None if grad_table else self.grad[off:off + p.numel()].view_as(p)
                           for p, off in zip(self.params, offsets)]
        self.fresh_grads = fresh_grads
        self._hook_grads(grad_table, fresh_grads)
        self.grad_scale = 1.0 if summed_grads else 1.0 / ranks
        # each parameter's number of updates (torch AdamW's state["step"]), on the device and copied on the host
        self.steps = torch.zeros(len(self.params), dtype=torch.float32, device=device)
        self.taken = [0] * len(self.params)
        self.recount = False  # whether `steps` was handed out (a checkpoint may load into it): re-read `taken`
        self.lr = torch.full((), lr, dtype=torch.float32, device=device)
        self.chunk = chunk
        self.bounds = [*offsets, size * ranks]  # parameter i's part of the flat buffers: bounds[i]..bounds[i + 1]
        self.update = torch.compile(adamw_update) if compile else adamw_update

    def _flatten(self, dtype: torch.dtype, ranks: int, grad_table: bool) -> tuple[list[int], int]:
        """Allocate the flat buffers (equal aligned shards over `ranks`), copy this rank's shard of every
        parameter into the fp32 master weights and make each parameter a view of the flat weights. Returns
        (each parameter's offset, the shard size)."""
        device = self.params[0].device
        offsets, total = [], 0
        for p in self.params:
            offsets.append(total)
            total += -(-p.numel() // _ALIGN) * _ALIGN
        total = -(-total // (ranks * _ALIGN)) * ranks * _ALIGN  # equal shards, each starting aligned
        size = total // ranks
        start = (dist.get_rank(self.group) if self.group is not None else 0) * size
        self.shard = (start, start + size)  # this rank's part of the flat buffers
        self.grad = None if grad_table else torch.zeros(total, dtype=dtype, device=device)
        self.weight = torch.zeros(total, dtype=dtype, device=device)
        # this rank's shard: fp32 state of its elements; their summed gradients land in grad_shard
        self.master = torch.zeros(size, dtype=torch.float32, device=device)
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.weight_shard = self.weight[start:start + size]
        if self.group is None:
            self.grad_shard = self.grad
        elif self.summed_grads:  # the summed gradient of this shard: this rank's slice of its own copy
            self.grad_shard = self.grad[start:start + size]
        else:  # the reduce-scatter's output
            self.grad_shard = torch.zeros_like(self.weight_shard)
        with torch.no_grad():
            for p, off in zip(self.params, offsets):
                lo, hi = max(off, start), min(off + p.numel(), start + size)
                if lo < hi:  # the part of p in this rank's shard, copied before p turns bf16
                    self.master[lo - start:hi - start].copy_(p.detach().reshape(-1)[lo - off:hi - off])
                weight = self.weight[off:off + p.numel()].view_as(p)
                weight.copy_(p)
                p.data = weight
                p.grad = None
        return offsets, size

    def _hook_grads(self, grad_table: bool, fresh_grads: bool) -> None:
        """Where each gradient goes: into its parameter's view of the flat buffer (copied by a hook, or accumulated
        there directly), or nowhere with the table."""
        for p, view in zip(self.params, self.grad_views):
            if grad_table:
                continue
            if fresh_grads:
                p.register_post_accumulate_grad_hook(functools.partial(_into_view, view=view))
            else:
                p.grad = view

    def _runs(self, live: list[bool]) -> list[tuple[int, int]]:
        """The parameters that have a gradient, as ranges of neighbours that took equally many updates."""
        if self.recount:
            self.taken = [int(n) for n in self.steps.tolist()]
            self.recount = False
        runs: list[tuple[int, int]] = []
        for i in range(len(self.params)):
            if not live[i]:
                continue
            if runs and runs[-1][1] == i and self.taken[runs[-1][0]] == self.taken[i]:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        return runs

    def _update(self, live: list[bool], grads: list[torch.Tensor | None]) -> None:
        """Update the parameters whose `live` is True (those without a gradient keep their weights, moments and
        step count, as torch's AdamW leaves them): through the gradient table (`grads[i]` is parameter i's
        gradient), else chunk by chunk of this rank's shard of the flat buffers."""
        for a, b in self._runs(live):
            self.steps[a:b] += 1
            self.taken[a:b] = [n + 1 for n in self.taken[a:b]]
            step = self.steps[a]
            if self.table is not None:
                self.table.launch(a, b, grads, self.master, self.exp_avg, self.exp_avg_sq, self.weight, step,
                                  self.lr, self.beta1, self.beta2, self.eps, self.weight_decay)
                continue
            start, end = self.shard
            first, last = max(self.bounds[a], start) - start, min(self.bounds[b], end) - start
            for c in range(first, last, self.chunk):
                s = slice(c, min(c + self.chunk, last))
                self.update(self.master[s], self.exp_avg[s], self.exp_avg_sq[s], self.grad_shard[s],
                            self.weight_shard[s], step, self.lr, self.beta1, self.beta2, self.eps,
                            self.weight_decay, self.grad_scale)

    def state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds, the tensors themselves (a load fills them in place): this rank's shard of the
        fp32 master weights and moments, and every parameter's update count ("step", re-read by the next update)."""
        self.recount = True
        return {"master": self.master, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "step": self.steps}

    @torch.no_grad()
    def step(self) -> None:
        """Collective with a group: the gradients are reduce-scattered in the flat buffer's dtype (bf16 by
        default: half the bytes of fp32, and the sum rounds about as coarsely as the bf16 gradients
        already are), scaled to their mean in fp32, and the new weights all-gathered from each shard."""
        live = [p.grad is not None for p in self.params]
        grads: list[torch.Tensor | None] = []
        for p, view, has_grad in zip(self.params, self.grad_views, live):
            if self.table is not None and has_grad:
                grads.append(aligned_grad(p, self.weight.dtype))
                continue
            if has_grad and p.grad is not view:
                _into_view(p, view)
            grads.append(None)
        if self.group is not None and not self.summed_grads:
            reduce_scatter_single(self.grad_shard, self.grad, group=self.group)
        self._update(live, grads)
        if self.group is not None:
            all_gather_single(self.weight, self.weight_shard, group=self.group)

    def zero_grad(self) -> None:
        if not self.fresh_grads:
            self.grad.zero_()
            return
        for p in self.params:
            p.grad = None
