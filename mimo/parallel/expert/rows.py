"""The MoE router losses where one row of the LM's input is split over ranks (LM sequence parallel, context
parallel): each MoE layer's per-row statistics are summed over the ranks holding the row's parts, so every
rank sees the whole row's (mimo.models.moe's contract).

The sum is an all-reduce whose backward is an all-reduce too (each rank uses the summed statistics, so the
gradient of its part is the sum of every rank's gradient of the sum), and each rank then counts 1/shards of
its rows' losses, so the ranks together count every row once. Of those ranks, the ones the trainer's log
reduction does not sum over (the TP ranks of sequence parallelism) record their statistics whole.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from mimo.models.moe import moe_layers


def _summed(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=group)
    return out


class _SumRows(torch.autograd.Function):
    """All-reduce (sum) forward and backward."""

    @staticmethod
    def forward(ctx, stats: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _summed(stats, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _summed(grad, ctx.group), None


def share_row_stats(lm: torch.nn.Module, group: ProcessGroup, shards: int, logged_shards: int) -> None:
    """Install the sum over `group` (the `shards` ranks holding parts of the same rows; collective over it at
    every MoE layer's training forward) in every MoE layer of `lm`; `logged_shards` of them are summed by the
    trainer's log reduction (the CP ranks). Not collective itself."""
    for moe in moe_layers(lm).values():
        moe.share_rows(lambda stats, group=group: _SumRows.apply(stats, group), shards, logged_shards)
