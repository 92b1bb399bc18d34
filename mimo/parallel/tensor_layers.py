"""The sharded layers of tensor parallelism: column- and row-parallel linears, the vocab-parallel embedding and
the vocab-parallel cross-entropy. Each is built from the full single-device module or parameter and keeps this
TP rank's contiguous slice (`mimo.parallel.tensor` installs them); every communication is one call of
`parallel/comm.py`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.distributed import ProcessGroup

from mimo.models.llm import WeightLoss
from mimo.models.loss import IGNORE_INDEX
from mimo.parallel.comm import (
    reduce_from_tp,
    reduce_scatter_to_sp,
)
from mimo.parallel.data import REPLICAS

SEQ_DIM = 1
"""Hidden states are `[B, S, H]`; sequence parallelism shards dim 1."""


def token_dim(x: torch.Tensor) -> int:
    """The dim sequence parallelism splits: the sequence of `[B, S, H]` states, the rows of `[N, H]` ones (the
    labelled rows of `perf.loss_rows_only`, an equal count per TP rank: `sequence_parallel_rows`)."""
    return x.dim() - 2

TP_PARTIAL_GRAD = "_mimo_tp_partial_grad"
"""Parameter attribute: True where each TP rank's gradient is a partial sum to be all-reduced."""


def _shard(t: torch.Tensor, group: ProcessGroup, dim: int) -> nn.Parameter:
    """This rank's contiguous chunk of a full parameter, as a fresh parameter counted once (REPLICAS 1)."""
    tp = dist.get_world_size(group)
    if t.shape[dim] % tp:
        raise ValueError(f"cannot shard a parameter of shape {tuple(t.shape)} along dim {dim} over tp={tp}; that "
                         f"size must be a multiple of {tp}")
    chunk = t.detach().chunk(tp, dim)[dist.get_rank(group)]
    p = nn.Parameter(chunk.clone(), requires_grad=t.requires_grad)
    setattr(p, REPLICAS, 1)
    return p


class ColumnParallelLinear(nn.Module):
    """A linear whose output features are split over the TP group (rank r keeps the r-th chunk).

    Does no communication itself: its input must already be in the TP region (replicated, entered
    through `copy_to_tp` or `gather_from_sp`), so that several column linears reading one input
    share one entry.
    """

    def __init__(self, full: nn.Linear, group: ProcessGroup):
        super().__init__()
        self.in_features = full.in_features
        self.out_features = full.out_features // dist.get_world_size(group)
        self.weight = _shard(full.weight, group, 0)
        self.bias = _shard(full.bias, group, 0) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def weight_loss(self, hidden: torch.Tensor, labels: torch.Tensor,
                    loss: WeightLoss) -> tuple[torch.Tensor, torch.Tensor]:
        """`loss(hidden, this rank's weight shard, labels)`, as `LMHead.weight_loss` (a vocab-parallel head's)."""
        return loss(hidden, self.weight, labels)


class RowParallelLinear(nn.Module):
    """A linear whose input features are split over the TP group; sums the partial outputs.

    Collective. Without sequence parallel the sum is an all-reduce; with it, a reduce-scatter along
    the sequence so each rank keeps its sequence shard. The bias is replicated and added after the
    sum; under sequence parallel its gradient covers only this rank's shard (marked TP_PARTIAL_GRAD).
    """

    def __init__(self, full: nn.Linear, group: ProcessGroup, sequence_parallel: bool):
        super().__init__()
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.in_features = full.in_features // dist.get_world_size(group)
        self.out_features = full.out_features
        self.weight = _shard(full.weight, group, 1)
        self.bias = None
        if full.bias is not None:
            self.bias = nn.Parameter(full.bias.detach().clone(), requires_grad=full.bias.requires_grad)
            setattr(self.bias, REPLICAS, dist.get_world_size(group))
            if sequence_parallel:
                setattr(self.bias, TP_PARTIAL_GRAD, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sp(y, self.group, token_dim(y))
        else:
            y = reduce_from_tp(y, self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split over the TP group by vocabulary range; a collective lookup.

    Each rank looks up the ids it owns, writes zeros for the others, and the all-reduce assembles the
    full, replicated embeddings. `weight` is this rank's vocab shard, which a tied LM head reuses.
    """

    def __init__(self, full: nn.Embedding, group: ProcessGroup):
        super().__init__()
        self.group = group
        self.num_embeddings = full.num_embeddings // dist.get_world_size(group)
        self.vocab_start = dist.get_rank(group) * self.num_embeddings
        self.weight = _shard(full.weight, group, 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return reduce_from_tp(out.masked_fill(outside[..., None], 0.0), self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross entropy over vocab-sharded logits, never materialising the full vocabulary."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, group: ProcessGroup,
                ignore_index: int) -> torch.Tensor:
        x = logits.float()
        n_local = x.shape[-1]
        top = x.max(dim=-1, keepdim=True).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        x = x - top
        local = labels - dist.get_rank(group) * n_local
        owned = (local >= 0) & (local < n_local)
        index = local.masked_fill(~owned, 0)[..., None]
        exp = x.exp()
        stats = torch.stack([exp.sum(-1), x.gather(-1, index).squeeze(-1) * owned])
        dist.all_reduce(stats, group=group)
        sum_exp, target = stats.unbind(0)
        ignored = labels == ignore_index
        loss = (sum_exp.log() - target).masked_fill(ignored, 0.0)
        ctx.save_for_backward(exp.div_(sum_exp[..., None]), index, owned, ignored)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        softmax, index, owned, ignored = ctx.saved_tensors
        g = softmax.scatter_add(-1, index, -owned[..., None].to(softmax.dtype))
        g.mul_(grad.masked_fill(ignored, 0.0)[..., None])
        return g.to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits_shard: torch.Tensor, labels: torch.Tensor, group: ProcessGroup,
                                 ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Collective. Per-token losses (shape of `labels`, 0 where ignored) from logits `[..., V/tp]` that
    hold rank r's contiguous vocab shard; equals `F.cross_entropy(full, labels, reduction="none")`.

    Three small all-reduces (max, then sum-exp with the target logit); backward is local: softmax
    minus the one-hot of the target on the owned slice.
    """
    if logits_shard.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits_shard.shape)} and labels {tuple(labels.shape)} must agree on "
                         "every dim but the last (vocab)")
    return _VocabParallelCrossEntropy.apply(logits_shard, labels, group, ignore_index)
