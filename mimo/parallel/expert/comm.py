"""Autograd-aware all-to-all with per-rank row counts, for sending token copies to their experts' ranks.

| function         | forward                                     | backward                             |
|------------------|---------------------------------------------|--------------------------------------|
| `exchange_counts`| all-to-all of per-rank counts (no autograd) |                                      |
| `all_to_all_rows`| rows to ranks by `send` counts, `recv` back | the same exchange with counts swapped|

Both are collective: every rank of `group` calls them in the same order. Counts are host integers (the
split sizes the collective needs); a count may be zero, so a rank may send or receive no rows at all.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


def exchange_counts(counts: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Collective. `counts` is `[ep, n]` (rows this rank sends to each rank, per item); returns `[ep, n]`
    with row s the counts rank s sends to this rank. Not differentiable."""
    out = torch.empty_like(counts)
    dist.all_to_all_single(out.view(-1), counts.contiguous().view(-1), group=group)
    return out


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group: ProcessGroup) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


class _AllToAllRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group: ProcessGroup) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def all_to_all_rows(x: torch.Tensor, send: list[int], recv: list[int], group: ProcessGroup) -> torch.Tensor:
    """Collective. Rows `x[:sum(send)]` go to the ranks of `group` in order, `send[r]` rows to rank r; returns
    the `sum(recv)` rows received, `recv[s]` from rank s, in rank order. Backward sends the gradients back
    along the same routes, so the gradient of `x` is exact."""
    if len(send) != dist.get_world_size(group) or len(recv) != len(send):
        raise ValueError(f"all_to_all_rows needs one send and one recv count per rank of the group "
                         f"({dist.get_world_size(group)}); got {len(send)} and {len(recv)}")
    if x.shape[0] != sum(send):
        raise ValueError(f"all_to_all_rows: x has {x.shape[0]} rows but the send counts sum to {sum(send)}")
    return _AllToAllRows.apply(x, send, recv, group)
