"""The loss chunk of `linear_cross_entropy` as one Triton kernel: per row, loss and logit gradient.

torch.compile splits the chunk into a log-sum-exp reduction and a pointwise pass that recomputes its
2-D indices per element; on a 152k vocabulary that ran at about a third of the card's bandwidth. Here one
program owns one row: it reads the row once for a running max and sum, then again (mostly from L2, the
row having just been read) to write the gradient over the logits. Same formula, fp32 statistics, as
`linear_ce.chunk_loss_and_grad`, which stays the reference (and the path wherever Triton is absent).
"""

from __future__ import annotations

import torch

from mimo.models.loss import IGNORE_INDEX
from mimo.perf.triton_support import tl, triton

if triton is not None:

    @triton.jit
    def _loss_and_grad_rows(logits_ptr, labels_ptr, losses_ptr, stride, label_stride, ignore_index,
                            VOCAB: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        ptr = logits_ptr + row * stride
        label = tl.load(labels_ptr + row * label_stride).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        # pass 1: per-lane running max and sum of exp (a finite floor keeps exp(floor - x) at 0, never NaN)
        lane_max = tl.full([BLOCK], -3.0e38, tl.float32)
        lane_sum = tl.zeros([BLOCK], tl.float32)
        for start in range(0, VOCAB, BLOCK):
            x = tl.load(ptr + start + cols, mask=start + cols < VOCAB, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(lane_max, x)
            lane_sum = lane_sum * tl.exp(lane_max - new_max) + tl.exp(x - new_max)
            lane_max = new_max
        row_max = tl.max(lane_max, 0)
        lse = row_max + tl.log(tl.sum(lane_sum * tl.exp(lane_max - row_max), 0))
        valid = label != ignore_index
        bad = valid & ((label < 0) | (label >= VOCAB))  # no such class: NaN, never a read outside the row
        target = tl.load(ptr + tl.where(valid & ~bad, label, 0)).to(tl.float32)
        tl.store(losses_ptr + row, tl.where(bad, float("nan"), tl.where(valid, lse - target, 0.0)))
        # pass 2: d(loss)/d(logits) = softmax - onehot, over the logits; rows without a label get zeros
        for start in range(0, VOCAB, BLOCK):
            idx = start + cols
            x = tl.load(ptr + idx, mask=idx < VOCAB, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse) - (idx == label).to(tl.float32)
            grad = tl.where(bad, float("nan"), tl.where(valid, grad, 0.0))
            tl.store(ptr + idx, grad.to(logits_ptr.dtype.element_ty), mask=idx < VOCAB)


def chunk_loss_into_grad(logits: torch.Tensor, labels: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Sum of the row losses of `logits` `[n, V]` (rows contiguous); the logits are overwritten with their
    gradient. Contract of `linear_ce.chunk_loss_into_grad` (a label outside [0, V) gives NaN)."""
    if logits.stride(-1) != 1:
        raise ValueError("the Triton loss chunk needs logits with contiguous rows")
    n, vocab = logits.shape
    losses = torch.empty(n, dtype=torch.float32, device=logits.device)
    _loss_and_grad_rows[(n,)](logits, labels, losses, logits.stride(0), labels.stride(0), IGNORE_INDEX,
                              VOCAB=vocab, BLOCK=block, num_warps=8)
    return losses.sum()
