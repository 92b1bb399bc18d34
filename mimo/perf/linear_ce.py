"""Linear + cross-entropy over chunks of rows: the output head never materialises full fp32 logits.

With a 152k vocabulary, the logits of a 16k-token micro-batch take 10 GB in fp32, and the usual path
writes and re-reads them several times (cast, log-softmax, its gradient, the head's two backward
products). Here each chunk of rows computes its bf16 logits and, in one fused pass, its loss, and
overwrites the logits with their gradient. The gradients of the rows and of the head weight are then
two large matrix products over all rows of a group (as many rows as `group_bytes` of bf16 logits
hold, typically all of them), so the head's gradient is summed in the product's fp32 accumulators and
rounded once. The backward only scales the stored gradients by the incoming scalar, so nothing is
recomputed and the FLOPs equal the plain path's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.distributed import ProcessGroup

from mimo.models.loss import IGNORE_INDEX
from mimo.perf import cross_entropy_triton, triton_support
from mimo.perf.vocab_parallel_ce import vocab_parallel_chunk

CHUNK_KERNELS = ("torch", "compiled", "triton")
ChunkFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def chunk_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of the token losses of `logits` `[n, V]` and d(sum)/d(logits) in the logits' dtype.

    Softmax statistics are taken in fp32 (or wider). Rows labelled IGNORE_INDEX add nothing and get a zero
    gradient; a label outside [0, V) (a tokenizer larger than the head, say) makes that row's loss and
    gradient NaN, which the training step reports as a non-finite loss, without a host sync.
    """
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(x, dim=-1)
    valid = labels != IGNORE_INDEX
    bad = valid & ((labels < 0) | (labels >= x.shape[1]))
    safe = torch.where(valid & ~bad, labels, 0)
    target = x.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(bad, torch.nan, torch.where(valid, lse - target, 0.0)).sum()
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == safe[:, None]
    grad = torch.exp(x - lse[:, None]) - onehot.to(x.dtype)
    grad = torch.where(bad[:, None], torch.nan, torch.where(valid[:, None], grad, 0.0))
    return loss, grad.to(logits.dtype)


def chunk_loss_into_grad(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`chunk_loss_and_grad` that overwrites `logits` with their gradient (no second buffer)."""
    loss, grad = chunk_loss_and_grad(logits, labels)
    logits.copy_(grad)
    return loss


@functools.cache
def _compiled_chunk_fn() -> ChunkFn:
    return torch.compile(chunk_loss_into_grad)


def chunk_kernel(kernel: str, device: torch.device) -> ChunkFn:
    """The loss chunk as `kernel` says: "torch" (eager), "compiled" (torch.compile) or "triton" (one
    hand-written kernel); "auto" is triton on a GPU where Triton is installed, else compiled on a GPU,
    else torch."""
    why = triton_support.unavailable(device)
    if kernel == "auto":
        kernel = "torch" if device.type != "cuda" else "compiled" if why else "triton"
    if kernel not in CHUNK_KERNELS:
        raise ValueError(f"unknown loss-chunk kernel '{kernel}'; choose one of auto, {', '.join(CHUNK_KERNELS)}")
    if kernel == "triton":
        if why is not None:
            raise ValueError(f"the triton loss chunk cannot run: {why}; use kernel 'compiled' or 'torch'")
        return cross_entropy_triton.chunk_loss_into_grad
    return _compiled_chunk_fn() if kernel == "compiled" else chunk_loss_into_grad


class _LinearCrossEntropy(torch.autograd.Function):
    """Gradients are computed in the forward (they are needed anyway) and scaled in the backward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_rows: int,
                group_rows: int, chunk_fn: ChunkFn) -> torch.Tensor:
        n = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden)
        acc = torch.promote_types(weight.dtype, torch.float32)
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        grad_logits = torch.empty(min(n, group_rows), weight.shape[0], dtype=hidden.dtype, device=hidden.device)
        grad_weight = torch.zeros_like(weight) if n == 0 else None  # a rank whose rows carry no label
        with torch.autocast(hidden.device.type, enabled=False):
            for g0 in range(0, n, group_rows):
                rows = hidden[g0:g0 + group_rows]
                buf = grad_logits[:rows.shape[0]]
                for c0 in range(0, rows.shape[0], chunk_rows):
                    chunk = buf[c0:c0 + chunk_rows]
                    torch.mm(rows[c0:c0 + chunk_rows], weight.t(), out=chunk)
                    loss += chunk_fn(chunk, labels[g0 + c0:g0 + c0 + chunk.shape[0]])
                torch.mm(buf, weight, out=grad_hidden[g0:g0 + rows.shape[0]])
                part = buf.t() @ rows
                # One group (the usual case): the product's fp32 accumulators summed every row. More: their
                # results add up in fp32 or wider.
                grad_weight = part if grad_weight is None else grad_weight.to(acc).add_(part)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         chunk_rows: int = 4096, kernel: str = "torch", group_bytes: int = 8 << 30,
                         tp_group: ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, number of loss tokens) of `hidden @ weight.T` against `labels`.

    hidden `[..., H]` and weight `[V, H]` share one dtype (the matmuls run in it); labels `[...]` are
    aligned with the rows that predict them, IGNORE_INDEX where no loss is taken. Same contract as
    `mimo.models.loss.cross_entropy_sum(hidden @ weight.T, labels)`. Chunks are near-equal in size so
    that a compiled chunk function sees at most two shapes; `kernel` picks how each chunk's softmax,
    loss and logit gradient run (`chunk_kernel`). `group_bytes` bounds the buffer of logit gradients
    (whole chunks; at least one).

    With `tp_group` the head is vocab-parallel (collective over that group): `weight` is this rank's
    contiguous vocabulary range `[V/tp, H]`, `hidden` and `labels` are the same on every rank of the group,
    the loss and count come out the same on every rank, and the gradient of `hidden` is this rank's part of
    the sum over the group (the caller's entry into the TP region, `copy_to_tp` or `gather_from_sp`, adds
    the parts up); chunks then run through `vocab_parallel_chunk` ("torch", "compiled" or "auto").
    """
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype")
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1)
    n = hidden.shape[0]
    chunks = max(1, -(-n // chunk_rows))
    rows = max(1, -(-n // chunks))
    group = max(1, group_bytes // (weight.shape[0] * hidden.element_size() * rows)) * rows
    if tp_group is None:
        fn = chunk_kernel(kernel, hidden.device)
    else:
        fn = vocab_parallel_chunk(tp_group, kernel, hidden.device)
    loss = _LinearCrossEntropy.apply(hidden, weight, labels, rows, group, fn)
    return loss, (labels != IGNORE_INDEX).sum().float()
