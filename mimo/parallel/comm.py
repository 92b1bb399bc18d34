"""Autograd-aware collectives for tensor and sequence parallelism over an explicit process group.

Each function is the forward half of a conjugate pair; its backward is the adjoint collective, so
that gradients of a TP-parallel module equal those of the single-process module:

| function               | forward                      | backward                     |
|------------------------|------------------------------|------------------------------|
| `copy_to_tp`           | identity                     | all-reduce (sum)             |
| `reduce_from_tp`       | all-reduce (sum)             | identity                     |
| `split_to_tp`          | keep this rank's chunk       | all-gather                   |
| `gather_from_tp`       | all-gather                   | keep this rank's chunk       |
| `gather_from_sp`       | all-gather                   | reduce-scatter (sum)         |
| `reduce_scatter_to_sp` | reduce-scatter (sum)         | all-gather                   |

All are collective: every rank of `group` must call them in the same order with equally shaped
tensors. Chunks are contiguous and equal, rank r holding the r-th. On a group of one rank each
function is the identity.

Backends: gloo (since torch 2.2) implements the single-tensor all-gather and reduce-scatter (the
latter as an all-reduce plus a local chunk), so the same calls run the CPU tests and use NCCL's real
reduce-scatter on GPUs; no list-based fallback is needed. torch 2.13 renamed them `*_single`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

# The single-tensor collectives, under torch 2.13's names where they exist (the old names warn there) and
# the old ones on earlier torch (2.11 on the GPU machines has only those).
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def collective_device(group: ProcessGroup | None = None) -> torch.device:
    """Where a tensor made only to be sent over `group` should live: this rank's GPU when the group
    runs NCCL (alone or beside gloo for host tensors), else the CPU."""
    if "nccl" in str(dist.get_backend(group)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _chunks(x: torch.Tensor, group: ProcessGroup, dim: int) -> int:
    """Size of one rank's chunk of `x` along `dim`; a clear error when it does not split evenly."""
    n = dist.get_world_size(group)
    if x.shape[dim] % n:
        raise ValueError(f"cannot split dim {dim} of size {x.shape[dim]} (shape {tuple(x.shape)}) evenly over "
                         f"{n} ranks; make that size a multiple of {n}")
    return x.shape[dim] // n


def _all_reduce(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=group)
    return out


def _split(x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
    size = _chunks(x, group, dim)
    return x.narrow(dim, dist.get_rank(group) * size, size).contiguous()


def _all_gather(x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
    """Gathered in the concatenated form along dim 0 (gloo rejects the stacked one), then moved to `dim`."""
    n = dist.get_world_size(group)
    out = x.new_empty((n * x.shape[0], *x.shape[1:]))
    all_gather_single(out, x.contiguous(), group=group)
    return out.unflatten(0, (n, -1)).movedim(0, dim).flatten(dim, dim + 1)


def _reduce_scatter(x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
    n = dist.get_world_size(group)
    _chunks(x, group, dim)
    stacked = x.unflatten(dim, (n, -1)).movedim(dim, 0).contiguous()
    out = x.new_empty(stacked.shape[1:])
    reduce_scatter_single(out, stacked.flatten(0, 1), group=group)
    return out


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _SplitToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _split(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_gather(grad, ctx.group, ctx.dim), None, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _split(grad, ctx.group, ctx.dim), None, None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _reduce_scatter(grad, ctx.group, ctx.dim), None, None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_gather(grad, ctx.group, ctx.dim), None, None


def _trivial(group: ProcessGroup) -> bool:
    return dist.get_world_size(group) == 1


def copy_to_tp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Collective. Enter the TP region with a replicated input: identity forward, gradient summed over
    `group` in backward (each rank's column shard contributes part of the input's gradient)."""
    return x if _trivial(group) else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Collective. Leave the TP region by summing partial results (row-parallel output) over `group`;
    the gradient of a replicated output passes through unchanged."""
    return x if _trivial(group) else _ReduceFromTP.apply(x, group)


def split_to_tp(x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
    """Collective (in backward). Keep this rank's contiguous chunk of a replicated `x` along `dim`;
    backward all-gathers the chunks' gradients into the full, replicated gradient."""
    return x if _trivial(group) else _SplitToTP.apply(x, group, dim % x.dim())


def gather_from_tp(x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
    """Collective. Concatenate every rank's chunk along `dim` into a replicated tensor; backward keeps
    this rank's chunk of the (replicated) gradient."""
    return x if _trivial(group) else _GatherFromTP.apply(x, group, dim % x.dim())


def gather_from_sp(x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
    """Collective. Sequence-parallel shard -> full sequence feeding column-parallel linears: all-gather
    along `dim` forward; backward reduce-scatters, summing the ranks' partial input gradients."""
    return x if _trivial(group) else _GatherFromSP.apply(x, group, dim % x.dim())


def reduce_scatter_to_sp(x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:
    """Collective. Row-parallel partial sums -> this rank's sequence shard of their total: reduce-scatter
    along `dim` forward; backward all-gathers the shards' gradients."""
    return x if _trivial(group) else _ReduceScatterToSP.apply(x, group, dim % x.dim())
