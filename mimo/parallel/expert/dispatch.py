"""The all-to-all token dispatcher: each token copy goes to the rank holding its expert and comes back.

With `ep` ranks in an expert-parallel group and E experts, rank r holds experts
[r * E/ep, (r + 1) * E/ep). Per MoE layer and microbatch, on every rank of the group:

1. the T tokens' k copies are sorted by expert (stable), and the per-expert counts exchanged
   (`exchange_counts`: rank s learns how many rows each rank sends to each of its experts);
2. the sorted copies travel to their experts' ranks (`all_to_all_rows`), are regrouped there by local
   expert (received rows arrive by source rank, then expert), and run through `expert_compute`;
3. the outputs travel back along the same routes, are unsorted and combined with the routing weights.

Dropless and exact for any routing: every copy is computed by its expert, whatever the imbalance (all
tokens to one expert, ranks receiving nothing). Backward is the adjoint of each step (the all-to-alls
send gradients back along the forward routes). The split sizes are one host sync per layer and microbatch
(expert_compute's loop path reads its per-expert counts too).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from mimo.parallel.expert.comm import all_to_all_rows, exchange_counts

ExpertCompute = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""(rows sorted by local expert [N, H], rows per local expert [E_local], first global expert) -> [N, H]."""


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return inv


def _run_local_experts(rows: torch.Tensor, recv: torch.Tensor, expert_compute: ExpertCompute,
                       first_expert: int) -> torch.Tensor:
    """`rows` arrive grouped by source rank, then local expert (`recv[s, j]` rows from rank s for expert j):
    regroup them by expert, compute, and put the outputs back in arrival order."""
    ep, local = recv.shape
    per_block = recv.reshape(-1).to(rows.device)
    expert_of_row = torch.arange(local, device=rows.device).repeat(ep).repeat_interleave(per_block)
    by_expert = torch.argsort(expert_of_row, stable=True)
    out = expert_compute(rows[by_expert], recv.sum(0), first_expert)
    return out[_inverse(by_expert)]


def all_to_all_moe(x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor, num_experts: int,
                   expert_compute: ExpertCompute, group: ProcessGroup) -> torch.Tensor:
    """Collective over `group` (the expert-parallel ranks). `x` `[T, H]` tokens, `weights` and `expert_ids`
    `[T, k]` their routing; returns `[T, H]`: sum over the k choices of weight x expert(token), computed by
    this rank's experts for every rank's copies routed to them. `expert_compute` runs this rank's
    `num_experts / ep` experts (global ids from `rank * num_experts / ep`, rank in `group`, which it is passed)
    on rows sorted by local expert."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    if num_experts % ep:
        raise ValueError(f"{num_experts} experts cannot be split over {ep} expert-parallel ranks (the gate's check)")
    local = num_experts // ep
    tokens, k = expert_ids.shape
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    copies = x[order // k]
    counts = torch.bincount(flat, minlength=num_experts).view(ep, local)
    recv = exchange_counts(counts, group)
    rows = torch.cat([counts.sum(1), recv.sum(1)]).tolist()  # the split sizes: one host sync
    send_rows, recv_rows = rows[:ep], rows[ep:]
    arrived = all_to_all_rows(copies, send_rows, recv_rows, group)
    done = _run_local_experts(arrived, recv, expert_compute, rank * local)
    back = all_to_all_rows(done, recv_rows, send_rows, group)
    per_choice = back[_inverse(order)].view(tokens, k, x.shape[-1])
    return (per_choice * weights.unsqueeze(-1).to(per_choice.dtype)).sum(1)


class ExpertParallelDispatch:
    """`MoEFeedForward.dispatcher` under expert parallelism over `group`: the layer's `w_*` hold this rank's
    experts only (its slice of dim 0 and `expert_offset`, see mimo.parallel.expert.layout), and `route` still
    names global experts. Collective over `group` in forward and backward."""

    def __init__(self, group: ProcessGroup):
        self.group = group

    def __call__(self, moe, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        return all_to_all_moe(x, weights, expert_ids, moe.num_experts, moe.expert_compute, self.group)
