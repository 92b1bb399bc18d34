"""The colocated pipeline bridge: one modality's rows from its encoder, which runs whole on every rank, to the
first stage of an LM pipelined over the same ranks, and their gradients back (a colocated layout whose LM has
pp > 1, `mimo.parallel.pipeline.colocated`).

The step runs in three phases, so each direction is one exchange per step rather than one per microbatch:
every rank first runs its encoder lane's share of every microbatch (`send_forward` keeps the rows), then
`exchange_forward` hands each LM lane the rows of its samples; the LM's pipeline runs (`recv_forward`,
`send_backward` on its first stage, in microbatch order); then `exchange_backward` hands each encoder lane the
gradient of its rows, which `recv_backward` gives out microbatch by microbatch.

Each exchange is one all-to-all over the world. A microbatch of P samples is cut into encoder lanes of
P / enc_dp samples and LM lanes of P / lm_dp (as mimo.parallel.bridge.pipelined's `lane_overlaps`); encoder
lane i owes LM lane j the rows of the samples both cover. Forward, lane i's TP rank 0 sends them to every
first-stage rank of lane j (its TP and CP ranks all build the whole sequence). Backward, lane j's first-stage
TP and CP rank 0 sends their gradient (its TP and CP ranks hold the same one, CP's crossing hook having summed
it) to every rank of lane i, so an encoder replica gets the gradient of its own rows, never a sum of copies.
Every rank reads the whole global batch, so each sample's rows are known on the host from its placeholders
(`begin`): no sizes travel and nothing waits on the device. Rows and their gradients travel in `wire_dtype`:
bfloat16 where the encoder's rows are bfloat16 (widened exactly) or the LM embeddings are (the alignment
narrows the rows to them anyway), else float32. The LM's first stage takes them in the embeddings' dtype, which
the alignment casts them to anyway, so their gradient is summed (over CP) as before the crossing; the encoder
casts it back to its rows' dtype.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from mimo.parallel.grid import Grid
from mimo.parallel.p2p import Outbox


def wire_dtype(rows: torch.dtype, embeddings: torch.dtype) -> torch.dtype:
    """The dtype rows cross in, given the encoder's rows' dtype and the LM embeddings' (which the alignment casts
    the rows to): bfloat16 where either is, so the crossing rounds nothing the alignment would not."""
    return torch.bfloat16 if torch.bfloat16 in (rows, embeddings) else torch.float32


def _exchange(send: list[list[torch.Tensor]], recv: list[list[int]], hidden: int, device: torch.device,
              wire: torch.dtype) -> list[list[torch.Tensor]]:
    """Collective over the world: the pieces `send[d]` (row blocks `[n, hidden]`) to rank d, in order, cast to
    `wire`; returns the pieces received from each rank s, of the sizes `recv[s]`."""
    flat = [p.detach().to(wire) for parts in send for p in parts]
    x = torch.cat(flat) if flat else torch.zeros(0, hidden, dtype=wire, device=device)
    sizes = [sum(n for n in r) for r in recv]
    out = x.new_empty(sum(sizes), hidden)
    dist.all_to_all_single(out, x, output_split_sizes=sizes,
                           input_split_sizes=[sum(p.shape[0] for p in parts) for parts in send])
    pieces = iter(out.split([n for r in recv for n in r]))
    return [[next(pieces) for _ in r] for r in recv]


class ColocatedPipelineBridge:
    """One modality's crossing on one rank of a colocated layout with a pipelined LM. Construct on every rank;
    it creates no group. Per step: `begin`, then on every rank `send_forward` for each microbatch, then
    `exchange_forward` (collective over the world); the LM's first stage calls `recv_forward` and later
    `send_backward` per microbatch in order; then `exchange_backward` (collective over the world), then on
    every rank `recv_backward` for each microbatch in order. Evaluation stops after the LM's forwards. Rows
    and gradients cross in `wire_dtype(rows, embeddings)`: the encoder's rows' dtype under its autocast and the
    LM embeddings' dtype."""

    def __init__(self, name: str, encoder: Grid, language: Grid, rank: int, hidden: int,
                 rows: torch.dtype = torch.float32, embeddings: torch.dtype = torch.float32):
        self.name, self.rank, self.hidden = name, rank, hidden
        self.rows, self.embeddings, self.wire = rows, embeddings, wire_dtype(rows, embeddings)
        enc, lm = [encoder.coords(r) for r in encoder.ranks], [language.coords(r) for r in language.ranks]
        self.enc_dp, self.lm_dp = encoder.dp, language.dp
        self.enc_lane, self.lm_lane = [c["dp"] for c in enc], [c["dp"] for c in lm]
        self.writer = [c["tp"] == 0 for c in enc]  # sends its encoder lane's rows
        self.first = [c["pp"] == 0 for c in lm]  # takes its LM lane's rows
        self.lead = [c["pp"] == 0 and c["tp"] == 0 and c["cp"] == 0 for c in lm]  # sends its LM lane's gradients
        self.ends: list[list[int]] = []

    def begin(self, sample_rows: list[list[int]]) -> None:
        """A step whose microbatch t holds `sample_rows[t][s]` rows of this modality in sample s (host ints, the
        same on every rank: the placeholders of the whole microbatch). Not collective."""
        self.ends = [[0, *itertools.accumulate(rows)] for rows in sample_rows]
        self.sent: list[torch.Tensor] = []
        self.received: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.grad_rows: list[torch.Tensor] = []

    def _span(self, t: int, lanes: int, lane: int) -> tuple[int, int]:
        """Rows [lo, hi) of microbatch t that data lane `lane` of `lanes` holds."""
        ends = self.ends[t]
        per_lane = (len(ends) - 1) // lanes
        return ends[lane * per_lane], ends[(lane + 1) * per_lane]

    def _overlap(self, t: int, enc_lane: int, lm_lane: int) -> tuple[int, int]:
        """Rows [lo, hi) of microbatch t that encoder lane `enc_lane` owes LM lane `lm_lane` (lo == hi: none)."""
        (a, b), (c, d) = self._span(t, self.enc_dp, enc_lane), self._span(t, self.lm_dp, lm_lane)
        return max(a, c), max(max(a, c), min(b, d))

    def _pieces(self, blocks: list[torch.Tensor], lanes: int, lane: int, enc_lane: int,
                lm_lane: int) -> list[torch.Tensor]:
        """Per microbatch, the overlap's rows out of `blocks[t]`, this rank's rows of data lane `lane` of `lanes`."""
        out = []
        for t, block in enumerate(blocks):
            (lo, hi), base = self._overlap(t, enc_lane, lm_lane), self._span(t, lanes, lane)[0]
            out.append(block[lo - base: hi - base])
        return out

    def _sizes(self, enc_lane: int, lm_lane: int) -> list[int]:
        return [hi - lo for lo, hi in (self._overlap(t, enc_lane, lm_lane) for t in range(len(self.ends)))]

    # Encoder side ------------------------------------------------------------------------------------
    def send_forward(self, rows: torch.Tensor, sample_rows: torch.Tensor, outbox: Outbox) -> None:
        """Every rank, per microbatch in order: its encoder lane's rows `[n, hidden]`, kept until `exchange_forward`
        (`sample_rows` and `outbox` are unused: the counts are known from `begin`)."""
        lo, hi = self._span(len(self.sent), self.enc_dp, self.enc_lane[self.rank])
        if rows.shape[0] != hi - lo:  # check_batch has compared inputs and placeholders: an encoder's invariant
            raise ValueError(f"Number of {self.name} tokens ({hi - lo}) does not match number of {self.name} "
                             f"embeddings ({rows.shape[0]}) in encoder lane {self.enc_lane[self.rank]}'s share of "
                             f"microbatch {len(self.sent)}")
        if rows.numel() and self.wire not in (rows.dtype, self.embeddings):  # an encoder's invariant too
            raise ValueError(f"{self.name} rows in {rows.dtype} would round to {self.wire} on the way to the LM; "
                             f"the encoder's rows are expected in {self.rows}")
        self.sent.append(rows)

    def exchange_forward(self, device: torch.device) -> None:
        """Collective over the world, after every microbatch's `send_forward`: each LM first-stage rank gets its
        lane's rows of every microbatch."""
        me, ranks = self.rank, range(len(self.writer))
        lane = self.enc_lane[me]
        send = [self._pieces(self.sent, self.enc_dp, lane, lane, self.lm_lane[d])
                if self.writer[me] and self.first[d] else [] for d in ranks]
        recv = [self._sizes(self.enc_lane[s], self.lm_lane[me]) if self.writer[s] and self.first[me] else []
                for s in ranks]
        got = _exchange(send, recv, self.hidden, device, self.wire)
        self.sent = []  # the encoder stages keep their rows for the backward; the bridge needs them no more
        if self.first[me]:
            self.received = [torch.cat([parts[t] for parts in got if parts]) for t in range(len(self.ends))]

    def recv_backward(self, rows: torch.Tensor) -> torch.Tensor:
        """Every rank, per microbatch in order after `exchange_backward`: the gradient of the rows this microbatch's
        `send_forward` took, in their dtype."""
        return self.grad_rows.pop(0).to(rows.dtype)

    # LM side -----------------------------------------------------------------------------------------
    def recv_forward(self, expected: torch.Tensor, hidden: int, device: torch.device) -> torch.Tensor:
        """LM first stage, per microbatch in order: the rows of this LM lane's samples (`expected`, each sample's
        placeholders, is what `begin` was given), a fresh leaf in the embeddings' dtype that requires grad."""
        return self.received.pop(0).to(self.embeddings).requires_grad_()

    def send_backward(self, grad: torch.Tensor | None, rows: torch.Tensor, outbox: Outbox) -> None:
        """LM first stage, per microbatch in order: the gradient of the rows `recv_forward` returned, kept until
        `exchange_backward` (`outbox` is unused)."""
        self.grads.append(torch.zeros_like(rows) if grad is None else grad)

    def exchange_backward(self, device: torch.device) -> None:
        """Collective over the world, after the LM's pipeline: every rank gets its encoder lane's rows' gradients."""
        me, ranks = self.rank, range(len(self.writer))
        lane = self.lm_lane[me]
        send = [self._pieces(self.grads, self.lm_dp, lane, self.enc_lane[d], lane) if self.lead[me] else []
                for d in ranks]
        recv = [self._sizes(self.enc_lane[me], self.lm_lane[s]) if self.lead[s] else [] for s in ranks]
        got = _exchange(send, recv, self.hidden, device, self.wire)
        self.grad_rows = [torch.cat([parts[t] for parts in got if parts]) for t in range(len(self.ends))]
        self.grads = []
