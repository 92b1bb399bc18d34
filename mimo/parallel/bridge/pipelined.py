"""The pipeline bridge (SPEC 2.5): one modality's rows from the encoder grid's last pipeline stage to
the LM grid's first stage, and their gradients back, when the two grids live on disjoint ranks.

Lanes and leaders: each side has one data lane per DP index; its leader is the lane's TP rank 0 at
the boundary stage (encoder: last stage, LM: first stage). Only leaders talk across the bridge; the
rest of the boundary stage's TP group is served by a broadcast from its leader.

Which lanes talk: a microbatch of P samples is cut contiguously into encoder lanes of P / enc_dp
samples and into LM lanes of P / lm_dp samples. Encoder lane i sends to LM lane j exactly the
samples both cover. That one rule is fan-in (several encoder lanes per LM lane, concatenated in
sample order), fan-out (one encoder lane split between LM lanes) and equal, and it also works when
neither DP divides the other.

Variable token counts: samples may hold different numbers of rows (images of one sample, or none).
Every forward message carries the per-sample row counts with the rows, so a sender can cut at
sample boundaries and the receiver can check each sample against its placeholder count (the error
message of the single-process alignment). Backward messages carry no sizes: each side already knows
how many rows went over each link.
"""

from __future__ import annotations

import itertools
from collections import deque

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from mimo.parallel.grid import Grid, Pair, pair_groups
from mimo.parallel.p2p import DTYPES, Outbox, recv_like, recv_message, send_message, send_payload


def lane_overlaps(enc_dp: int, lm_dp: int, per_microbatch: int) -> list[tuple[int, int, int, int]]:
    """(encoder lane, LM lane, first sample, end sample) of every non-empty overlap, samples relative to
    the microbatch, ordered by sample (so by encoder lane, then LM lane). Pure."""
    e, m = per_microbatch // enc_dp, per_microbatch // lm_dp
    out = []
    for i in range(enc_dp):
        for j in range(lm_dp):
            lo, hi = max(i * e, j * m), min((i + 1) * e, (j + 1) * m)
            if lo < hi:
                out.append((i, j, lo, hi))
    return out


def bridge_pairs(encoder: Grid, language: Grid, per_microbatch: int) -> list[Pair]:
    """(encoder leader, LM leader) for every lane overlap, in sample order. Pure."""
    return [(encoder.rank_of(dp=i, pp=encoder.pp - 1), language.rank_of(dp=j))
            for i, j, _, _ in lane_overlaps(encoder.dp, language.dp, per_microbatch)]


class PipelineBridge:
    """One modality's crossing between disjoint encoder and LM grids, seen from one rank.

    Construct on every rank, in the same order (it creates the leaders' pair groups). Per microbatch,
    in schedule order: the encoder's last stage calls `send_forward` then, later, `recv_backward`; the
    LM's first stage calls `recv_forward` then, later, `send_backward`. Other ranks never call it.
    `tp_group` is this rank's TP group when it sits on a boundary stage (on the LM's side its TP x CP
    group: CP ranks take the same rows). `per_microbatch` divides by both modules' dp (`validate_plan`
    checks it before any collective). Which lanes talk does not depend on the microbatch's size, so a
    microbatch of another size (packed rows, padded to `batch_multiple`) crosses the same links: each call
    takes the size from the samples it is given.
    """

    def __init__(self, name: str, encoder: Grid, language: Grid, per_microbatch: int, rank: int,
                 tp_group: ProcessGroup | None):
        self.name, self.rank, self.tp_group = name, rank, tp_group
        pairs = bridge_pairs(encoder, language, per_microbatch)
        self.forward_groups = pair_groups(pairs)
        self.backward_groups = pair_groups([(b, a) for a, b in pairs])
        self.enc_dp, self.lm_dp = encoder.dp, language.dp
        overlaps = lane_overlaps(encoder.dp, language.dp, per_microbatch)
        # Peers of this rank if it is a leader: (peer rank, encoder lane, LM lane).
        self.receivers = [(b, i, j) for (a, b), (i, j, _, _) in zip(pairs, overlaps) if a == rank]
        self.senders = [a for a, b in pairs if b == rank]
        # Leaders, per microbatch in flight: rows (and on the LM side their dtype) on each link.
        self.peer_rows: deque[list[tuple[int, torch.dtype]]] = deque()

    def _tp(self) -> int:
        return 1 if self.tp_group is None else dist.get_world_size(self.tp_group)

    def _broadcast(self, t: torch.Tensor) -> None:
        if self._tp() > 1 and t.numel():
            dist.broadcast(t, group=self.tp_group, group_src=0)

    # Encoder side ------------------------------------------------------------------------------------
    def send_forward(self, rows: torch.Tensor, sample_rows: torch.Tensor, outbox: Outbox) -> None:
        """Encoder last stage: this lane's rows `[n, H]` and rows per sample `[samples]` to the LM lanes."""
        per_sample = sample_rows.tolist()  # the one host sync of a send
        if sum(per_sample) != rows.shape[0]:
            raise ValueError(f"bridge '{self.name}': expected per-sample rows summing to {rows.shape[0]}, got "
                             f"per-sample counts {per_sample}")
        if not self.receivers:
            return
        ends = [0, *itertools.accumulate(per_sample)]
        enc, lm = len(per_sample), len(per_sample) * self.enc_dp // self.lm_dp  # samples of a lane on each side
        sent = []
        for peer, i, j in self.receivers:  # the samples both lanes cover, relative to this lane
            lo, hi = max(j * lm - i * enc, 0), min((j + 1) * lm - i * enc, enc)
            part = rows[ends[lo]: ends[hi]]
            send_message([sample_rows[lo:hi], part], peer, self.forward_groups[(self.rank, peer)], outbox)
            sent.append((part.shape[0], part.dtype))
        self.peer_rows.append(sent)

    def recv_backward(self, rows: torch.Tensor) -> torch.Tensor:
        """Encoder last stage: the gradient of `rows` (what `send_forward` sent), TP-replicated."""
        grad = torch.empty_like(rows)
        if self.receivers:
            parts = [recv_like([rows.new_empty(n, rows.shape[1])], peer,
                               self.backward_groups[(peer, self.rank)])[0]
                     for (peer, _, _), (n, _) in zip(self.receivers, self.peer_rows.popleft())]
            grad = torch.cat(parts)
        self._broadcast(grad)
        return grad

    # LM side -----------------------------------------------------------------------------------------
    def recv_forward(self, expected: torch.Tensor, hidden: int, device: torch.device) -> torch.Tensor:
        """LM first stage: rows for this lane's samples, given each sample's placeholder count; the rows
        are a fresh leaf that requires grad, identical on every TP rank."""
        rows, counts = [], []
        for peer in self.senders:
            sample_rows, part = recv_message(peer, self.forward_groups[(peer, self.rank)], device)
            counts.append(sample_rows)
            rows.append(part)
        if self.senders:
            got = torch.cat(counts)
            cat = torch.cat([r.to(rows[0].dtype) for r in rows])
            meta = torch.tensor([DTYPES.index(cat.dtype), cat.shape[1], *got.tolist()], device=device)
        else:
            meta = torch.empty(2 + expected.shape[0], dtype=torch.long, device=device)
        self._broadcast(meta)
        dtype_index, width, *got = meta.tolist()  # with the next line, the receive's host syncs
        self._check(got, expected.tolist(), width, hidden)
        if not self.senders:
            cat = torch.empty(sum(got), width, dtype=DTYPES[dtype_index], device=device)
        else:
            self.peer_rows.append([(r.shape[0], r.dtype) for r in rows])
        self._broadcast(cat)
        return cat.requires_grad_()

    def _check(self, got: list[int], expected: list[int], width: int, hidden: int) -> None:
        """Same verdict on every TP rank (they all hold `got` after the broadcast)."""
        if width != hidden:
            raise ValueError(f"bridge '{self.name}': encoder rows have width {width} but the LM's hidden size is "
                             f"{hidden}; set the projector's output to model.llm.hidden")
        if len(got) != len(expected):
            raise ValueError(f"bridge '{self.name}': the encoder lanes sent rows of {len(got)} samples, this LM lane "
                             f"holds {len(expected)}")
        bad = [s for s, (g, e) in enumerate(zip(got, expected)) if g != e]
        if bad:
            s = bad[0]
            raise ValueError(f"Number of {self.name} tokens ({expected[s]}) does not match number of "
                             f"{self.name} embeddings ({got[s]}) in sample {s} of this LM lane's microbatch")

    def send_backward(self, grad: torch.Tensor | None, rows: torch.Tensor, outbox: Outbox) -> None:
        """LM first stage: the gradient of the rows `recv_forward` returned, back to the encoder lanes."""
        if not self.senders:
            return
        grad = torch.zeros_like(rows) if grad is None else grad
        links = self.peer_rows.popleft()
        for peer, part, (_, dtype) in zip(self.senders, grad.split([n for n, _ in links]), links):
            send_payload([part.to(dtype)], peer, self.backward_groups[(self.rank, peer)], outbox)

