"""The colocated pipeline bridge: one modality's rows from its encoder, which runs whole on every rank, to the
first stage of an LM pipelined over the same ranks, and their gradients back (a colocated layout whose LM has
pp > 1, `mimo.parallel.pipeline.colocated`).

The step runs in three phases, so each direction is one exchange per step rather than one per microbatch:
every rank first runs its encoder lane's share of every microbatch (`send_forward` keeps the rows), then
`exchange_forward` hands each LM lane the rows of its samples; the LM's pipeline runs (`recv_forward`,
`send_backward` on its first stage, in microbatch order); then `exchange_backward` hands each encoder lane the
gradient of its rows, which `recv_backward` gives out microbatch by microbatch.

Both exchanges are one all-reduce over the world of a buffer holding the step's rows of every sample, in
(microbatch, sample) order. Every row is written by exactly one rank and the others add zeros, so the sum is
exact: forward, the encoder lane's TP rank 0 writes its lane's rows; backward, the LM lane's first-stage TP and
CP rank 0 writes its lane's rows' gradient (its TP and CP ranks hold the same one, CP's crossing hook having
summed it), so an encoder replica keeps the gradient of its own rows, never a sum of copies. Every rank reads
the whole global batch, so each sample's rows are known on the host from its placeholders (`begin`): no sizes
travel. The buffer is float32 whatever the rows' dtype (bf16 and fp16 values convert exactly both ways); each
lane's writer adds its rows' dtype in a slot of its own, read once per step on the host.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from mimo.parallel.grid import Grid
from mimo.parallel.p2p import DTYPES, Outbox


def _lane_spans(sample_rows: list[int], lanes: int, lane: int, start: int) -> tuple[int, int]:
    """[lo, hi) rows of data lane `lane` of `lanes` in a microbatch whose samples hold `sample_rows` rows, the
    microbatch's rows starting at row `start` of the step's buffer."""
    per_lane = len(sample_rows) // lanes
    ends = [0, *itertools.accumulate(sample_rows)]
    return start + ends[lane * per_lane], start + ends[(lane + 1) * per_lane]


class ColocatedPipelineBridge:
    """One modality's crossing on one rank of a colocated layout with a pipelined LM. Construct on every rank;
    it creates no group. Per step: `begin`, then on every rank `send_forward` for each microbatch, then
    `exchange_forward` (collective over the world); the LM's first stage calls `recv_forward` and later
    `send_backward` per microbatch in order; then `exchange_backward` (collective over the world), then on
    every rank `recv_backward` for each microbatch in order. Evaluation stops after the LM's forwards."""

    def __init__(self, name: str, encoder: Grid, language: Grid, rank: int, hidden: int):
        self.name, self.hidden = name, hidden
        enc, lm = encoder.coords(rank), language.coords(rank)
        self.enc_lane, self.enc_dp, self.lm_lane, self.lm_dp = enc["dp"], encoder.dp, lm["dp"], language.dp
        self.writes_rows = enc["tp"] == 0
        self.writes_grads = lm["pp"] == 0 and lm["tp"] == 0 and lm["cp"] == 0
        self.enc_spans: list[tuple[int, int]] = []
        self.lm_spans: list[tuple[int, int]] = []
        self.total = 0

    def begin(self, sample_rows: list[list[int]]) -> None:
        """A step whose microbatch t holds `sample_rows[t][s]` rows of this modality in sample s (host ints, the
        same on every rank: the placeholders of the whole microbatch). Not collective."""
        self.enc_spans, self.lm_spans, start = [], [], 0
        for rows in sample_rows:
            self.enc_spans.append(_lane_spans(rows, self.enc_dp, self.enc_lane, start))
            self.lm_spans.append(_lane_spans(rows, self.lm_dp, self.lm_lane, start))
            start += sum(rows)
        self.total = start
        self.sent: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.received = self.grad_rows = None
        self.received_count = 0
        self.dtype = torch.float32

    def _buffer(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the whole buffer, its rows `[total, hidden]`, the lanes' dtype slots `[enc_dp]`): float32 zeros."""
        flat = torch.zeros(self.total * self.hidden + self.enc_dp, device=device)
        return flat, flat[: self.total * self.hidden].view(self.total, self.hidden), flat[self.total * self.hidden:]

    # Encoder side ------------------------------------------------------------------------------------
    def send_forward(self, rows: torch.Tensor, sample_rows: torch.Tensor, outbox: Outbox) -> None:
        """Every rank, per microbatch in order: its encoder lane's rows `[n, hidden]` (kept until
        `exchange_forward`; `sample_rows` and `outbox` are unused, the counts being known from `begin`)."""
        lo, hi = self.enc_spans[len(self.sent)]
        if rows.shape[0] != hi - lo:  # check_batch has compared inputs and placeholders: an encoder's invariant
            raise ValueError(f"Number of {self.name} tokens ({hi - lo}) does not match number of {self.name} "
                             f"embeddings ({rows.shape[0]}) in encoder lane {self.enc_lane}'s share of microbatch "
                             f"{len(self.sent)}")
        self.sent.append(rows)

    def exchange_forward(self, device: torch.device) -> None:
        """Collective over the world, after every microbatch's `send_forward`: every LM lane's rows, and the rows'
        dtype (one host sync)."""
        flat, buf, slots = self._buffer(device)
        if self.writes_rows:
            for (lo, hi), rows in zip(self.enc_spans, self.sent):
                buf[lo:hi] = rows.detach()
            dtypes = {rows.dtype for rows in self.sent if rows.numel()}
            if dtypes:
                slots[self.enc_lane] = DTYPES.index(dtypes.pop()) + 1
        dist.all_reduce(flat)
        codes = [int(c) for c in slots.tolist() if c]
        self.dtype = DTYPES[codes[0] - 1] if codes else torch.float32
        self.received, self.sent = buf, []

    def recv_backward(self, rows: torch.Tensor) -> torch.Tensor:
        """Every rank, per microbatch in order after `exchange_backward`: the gradient of the rows this microbatch's
        `send_forward` took, in their dtype."""
        lo, hi = self.enc_spans[len(self.sent)]
        self.sent.append(rows)
        return self.grad_rows[lo:hi].to(rows.dtype)

    # LM side -----------------------------------------------------------------------------------------
    def recv_forward(self, expected: torch.Tensor, hidden: int, device: torch.device) -> torch.Tensor:
        """LM first stage, per microbatch in order: the rows of this LM lane's samples (`expected`, each sample's
        placeholders, is what `begin` was given), a fresh leaf that requires grad, in the encoder's dtype."""
        lo, hi = self.lm_spans[self.received_count]
        self.received_count += 1
        return self.received[lo:hi].detach().to(self.dtype).requires_grad_()

    def send_backward(self, grad: torch.Tensor | None, rows: torch.Tensor, outbox: Outbox) -> None:
        """LM first stage, per microbatch in order: the gradient of the rows `recv_forward` returned (kept until
        `exchange_backward`; `outbox` is unused)."""
        self.grads.append(torch.zeros_like(rows) if grad is None else grad)

    def exchange_backward(self, device: torch.device) -> None:
        """Collective over the world, after the LM's pipeline: every encoder lane's rows' gradient."""
        flat, buf, _ = self._buffer(device)
        if self.writes_grads:
            for (lo, hi), grad in zip(self.lm_spans, self.grads):
                buf[lo:hi] = grad.detach()
        dist.all_reduce(flat)
        self.grad_rows, self.grads, self.sent = buf, [], []
