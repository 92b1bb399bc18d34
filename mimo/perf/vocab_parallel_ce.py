"""The chunked head + loss under tensor parallelism: each rank holds one vocabulary shard of the head.

`linear_cross_entropy(..., tp_group=g)` runs its chunks through `vocab_parallel_chunk`: a chunk's logits
`[n, V/tp]` are this rank's vocabulary range only, and two small all-reduces over the TP group give every
rank the full softmax statistics of each row (the row maxima, MAX; then the sums of exponentials and the
target logits, SUM, the target coming from the one rank whose range holds it). Each rank then overwrites
its logits with their gradient and returns the chunk's loss sum, the same on every rank. No rank ever
holds another rank's vocabulary range, and no rank holds a chunk's fp32 logits.

The local work between the collectives is two pure functions, compiled on a GPU ("compiled" kernel):
torch.compile fuses each into one pass over the chunk, while the collectives stay eager between them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from mimo.models.loss import IGNORE_INDEX

ChunkFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
VOCAB_PARALLEL_KERNELS = ("torch", "compiled")


def _shard_stats(logits: torch.Tensor, top: torch.Tensor, labels: torch.Tensor, vocab_start: int) -> torch.Tensor:
    """`[2, n]`: this shard's sum of exp(logit - top) per row, and the target logit - top where this shard
    holds the target (0 elsewhere)."""
    x = logits.to(top.dtype) - top[:, None]
    local = labels - vocab_start
    owned = (local >= 0) & (local < x.shape[1])
    target = x.gather(1, torch.where(owned, local, 0)[:, None]).squeeze(1)
    return torch.stack([x.exp().sum(1), torch.where(owned, target, 0.0)])


def _shard_loss_into_grad(logits: torch.Tensor, top: torch.Tensor, stats: torch.Tensor, labels: torch.Tensor,
                          vocab_start: int, vocab: int) -> torch.Tensor:
    """From the all-reduced `stats`: the rows' loss sum (NaN for a label outside [0, vocab)), and this
    shard's logit gradient written over `logits` (zero on ignored rows)."""
    sum_exp, target = stats.unbind(0)
    log_sum = sum_exp.log()
    valid = labels != IGNORE_INDEX
    bad = valid & ((labels < 0) | (labels >= vocab))
    loss = torch.where(bad, torch.nan, torch.where(valid, log_sum - target, 0.0)).sum()
    columns = torch.arange(logits.shape[1], device=logits.device) + vocab_start
    onehot = columns[None, :] == labels[:, None]
    grad = torch.exp(logits.to(top.dtype) - (top + log_sum)[:, None]) - onehot.to(top.dtype)
    grad = torch.where(bad[:, None], torch.nan, torch.where(valid[:, None], grad, 0.0))
    logits.copy_(grad)
    return loss


@functools.cache
def _compiled() -> tuple[Callable, Callable]:
    return torch.compile(_shard_stats), torch.compile(_shard_loss_into_grad)


def vocab_parallel_chunk(group: ProcessGroup, kernel: str, device: torch.device) -> ChunkFn:
    """`linear_ce`'s chunk function for a head whose rows are split over `group` (rank r holding the r-th
    contiguous range). Collective over `group`: every rank must call it on the same rows (the hidden states
    are replicated in the TP region). `kernel`: "torch" (eager), "compiled", or "auto" (compiled on a GPU)."""
    if kernel == "auto":
        kernel = "compiled" if device.type == "cuda" else "torch"
    if kernel not in VOCAB_PARALLEL_KERNELS:
        raise ValueError(f"the vocab-parallel loss chunk has no kernel '{kernel}'; choose one of auto, "
                         f"{', '.join(VOCAB_PARALLEL_KERNELS)}")
    stats_fn, loss_fn = _compiled() if kernel == "compiled" else (_shard_stats, _shard_loss_into_grad)
    tp, rank = dist.get_world_size(group), dist.get_rank(group)

    def chunk(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        n_local = logits.shape[1]
        top = logits.amax(1).to(torch.promote_types(logits.dtype, torch.float32))
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        stats = stats_fn(logits, top, labels, rank * n_local)
        dist.all_reduce(stats, group=group)
        return loss_fn(logits, top, stats, labels, rank * n_local, tp * n_local)

    return chunk
