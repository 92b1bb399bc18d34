"""Linear + cross-entropy over chunks of rows: the output head never materialises full fp32 logits.

With a 152k vocabulary, the logits of a 16k-token micro-batch take 10 GB in fp32, and the usual path
writes and re-reads them several times (cast, log-softmax, its gradient, the head's two backward
products). Here each chunk of rows computes its bf16 logits, its loss and the gradient of those logits
in one fused pass, turns that gradient straight into the gradients of the rows and of the head weight,
and drops the logits. The backward only scales the stored gradients by the incoming scalar, so nothing
is recomputed and the FLOPs equal the plain path's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from mimo.train.loss import IGNORE_INDEX

ChunkFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def chunk_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of the token losses of `logits` `[n, V]` and d(sum)/d(logits) in the logits' dtype.

    Softmax statistics are taken in fp32 (or wider). Rows labelled IGNORE_INDEX add nothing and get a zero
    gradient.
    """
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(x, dim=-1)
    valid = labels != IGNORE_INDEX
    safe = labels.clamp_min(0)
    target = x.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(valid, lse - target, 0.0).sum()
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == safe[:, None]
    grad = torch.exp(x - lse[:, None]) - onehot.to(x.dtype)
    return loss, torch.where(valid[:, None], grad, 0.0).to(logits.dtype)


@functools.cache
def _compiled_chunk_fn() -> ChunkFn:
    return torch.compile(chunk_loss_and_grad)


class _LinearCrossEntropy(torch.autograd.Function):
    """Gradients are computed in the forward (they are needed anyway) and scaled in the backward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_rows: int,
                chunk_fn: ChunkFn) -> torch.Tensor:
        grad_hidden = torch.empty_like(hidden)
        # Sums over every chunk (the loss, the head's gradient) accumulate in fp32 or wider, rounded once.
        acc = torch.promote_types(weight.dtype, torch.float32)
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk_rows):
                rows = hidden[start:start + chunk_rows]
                chunk_loss, grad_logits = chunk_fn(rows @ weight.t(), labels[start:start + chunk_rows])
                loss += chunk_loss
                torch.mm(grad_logits, weight, out=grad_hidden[start:start + chunk_rows])
                grad_weight += grad_logits.t() @ rows
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         chunk_rows: int = 4096, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, number of loss tokens) of `hidden @ weight.T` against `labels`.

    hidden `[..., H]` and weight `[V, H]` share one dtype (the matmuls run in it); labels `[...]` are
    aligned with the rows that predict them, IGNORE_INDEX where no loss is taken. Same contract as
    `mimo.train.loss.cross_entropy_sum(hidden @ weight.T, labels)`. Chunks are near-equal in size so
    that a compiled chunk function sees at most two shapes; `compiled` fuses each chunk's softmax,
    loss and logit gradient into a couple of kernels.
    """
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype")
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1)
    n = hidden.shape[0]
    chunks = max(1, -(-n // chunk_rows))
    rows = -(-n // chunks)
    fn = _compiled_chunk_fn() if compiled else chunk_loss_and_grad
    loss = _LinearCrossEntropy.apply(hidden, weight, labels, rows, fn)
    return loss, (labels != IGNORE_INDEX).sum().float()
