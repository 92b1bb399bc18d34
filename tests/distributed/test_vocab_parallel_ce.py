"""The vocab-parallel chunked head + loss (`linear_cross_entropy(..., tp_group=...)`) on 2 gloo ranks equals the
single-device chunked loss over the whole head: loss sum and count on every rank, the hidden states' gradient
summed over the ranks, and each rank's rows of the weight's gradient, within 1e-6 relative. Rows are split
into several chunks and several groups (the multi-chunk, multi-group paths), labels include ignored rows and
targets in either rank's range; a label outside the vocabulary makes the loss NaN on every rank."""

import torch
import torch.distributed as dist

from mimo.perf.linear_ce import linear_cross_entropy
from tests.support.dist import run_distributed
from tests.support.parity import close

RTOL = 1e-6
N, H, V = 37, 16, 24


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    labels = torch.randint(0, V, (N,), generator=g)
    labels[::5] = -100
    return hidden, weight, labels


def _loss_and_grads(hidden, weight, labels, **kwargs):
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, count = linear_cross_entropy(hidden, weight, labels, chunk_rows=8, group_bytes=16 * V * 8, **kwargs)
    (loss * 0.5).backward()
    return loss.detach(), count, hidden.grad, weight.grad


def _compare(rank: int, world: int) -> None:
    hidden, weight, labels = _inputs()
    ref_loss, ref_count, ref_hidden, ref_weight = _loss_and_grads(hidden, weight, labels)
    rows = V // world
    shard = weight[rank * rows:(rank + 1) * rows]
    loss, count, grad_hidden, grad_shard = _loss_and_grads(hidden, shard, labels, tp_group=dist.group.WORLD)
    close("loss", loss, ref_loss, RTOL)
    assert count == ref_count == (labels != -100).sum()
    dist.all_reduce(grad_hidden)
    close("hidden gradient summed over ranks", grad_hidden, ref_hidden, RTOL)
    close("weight gradient of this rank's rows", grad_shard, ref_weight[rank * rows:(rank + 1) * rows], RTOL)

    bad = labels.clone()
    bad[3] = V
    loss, _, _, _ = _loss_and_grads(hidden, shard, bad, tp_group=dist.group.WORLD)
    assert torch.isnan(loss), loss


def test_vocab_parallel_chunked_loss_equals_the_whole_head():
    run_distributed(_compare, 2, timeout=120)
