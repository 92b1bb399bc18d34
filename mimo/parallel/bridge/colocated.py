"""The encoder <-> LM crossing on colocated layouts: the one place where tensors move between two modules'
data-parallel layouts on the same ranks.

Colocated layouts (SPEC 2.4): the encoder and the LM share every rank but each has its own TP and DP
degree, so a rank's *encoder replica* and its *LM replica* hold different slices of the microbatch. Both
sides slice the microbatch contiguously by DP rank (any two degrees: 3 encoder lanes and 2 LM lanes
are fine), and with tp (and cp) varying fastest a data lane is a contiguous run of ranks, its *stride*.
Lane boundaries of both sides meet every lcm(encoder stride, LM stride) ranks: such a *block* holds
whole lanes of both sides and the same samples for both. Inside a block the ranks whose offsets agree
modulo gcd(strides) form one bridge group, which holds at least one rank of every lane of either side.

A move takes each member's rows (the rows of its source-side lane's samples), all-gathers them over
the group, lays out the block's rows in sample order from one member per source lane (members of a
lane hold the same rows: TP replicas), and keeps the samples of the member's destination lane. Samples
move by ranges, so the DP degrees need not divide one another. Its backward is the move the other way
(one member per destination lane sends each sample's gradient, never a sum of replicas' copies):

- `to_language`: encoder rows -> the LM's placeholders (the In path); backward returns each encoder
  replica the gradient of its own rows;
- `to_encoder`: the LM's states at generation tokens -> the modality's layout, where its Out-path
  decoder runs on its own DP lanes; the decoded rows come back with `to_language`.

Rows per sample may vary. Both moves take the LM replica's per-sample row counts and, where the caller
knows them on the host (`microbatch_rows`: every sample's rows of the whole microbatch, which
`ParallelPlan.microbatches` derives from the global batch on every rank), those: then a move is one
all-gather of the rows and no host sync. Without them one all-gather of the counts (with every member's
row count) comes first, so every member checks every member's rows and all raise the same error. Equal
DP degrees: identity, no collective.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mimo.parallel.grid import Grid, member_group


def _all_gather_rows(x: torch.Tensor, sizes: list[int], group: dist.ProcessGroup) -> list[torch.Tensor]:
    """Collective over `group`: every member's rows (member i has sizes[i] rows), in member order."""
    padded = x.new_zeros((max(sizes), *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return [p[:n] for p, n in zip(parts, sizes)]


@dataclass(frozen=True)
class _Move:
    """One re-partition inside a bridge group: rows each member holds, one member per source lane (in
    lane order: their rows, concatenated, are the block's rows in sample order), and this member's
    destination rows as a range of them."""

    group: dist.ProcessGroup
    sizes: list[int]
    sources: list[int]
    keep: tuple[int, int]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Collective over the group."""
        parts = _all_gather_rows(x, self.sizes, self.group)
        block = torch.cat([parts[k] for k in self.sources], dim=0)
        return block[self.keep[0] : self.keep[1]].contiguous()


class _MoveRows(torch.autograd.Function):
    """Forward: `there`. Backward: `back`, the same samples' move the other way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, there: _Move, back: _Move) -> torch.Tensor:
        ctx.back = back
        return there(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.back(grad.contiguous()), None, None


def peer_groups(encoder: Grid, language: Grid) -> list[list[int]]:
    """The bridge groups of two colocated grids as rank lists, in creation order (pure, no collectives): per
    block of lcm(strides) ranks, the ranks equal modulo gcd(strides); none for equal DP degrees."""
    if encoder.dp == language.dp:
        return []
    strides = (encoder.size // encoder.dp, language.size // language.dp)
    block, step = math.lcm(*strides), math.gcd(*strides)
    return [list(range(base + t, base + block, step)) for base in range(encoder.offset, encoder.end, block)
            for t in range(step)]


class ColocatedBridge:
    """Re-partitions one modality's rows between the encoder grid's DP layout and the LM grid's.

    Build it on every rank, in the same order (group creation is collective). Each call is collective over
    the rank's bridge group and takes the rows and the LM replica's per-sample row counts (`[n]`, n = the
    LM lane's samples).
    """

    def __init__(self, encoder: Grid, language: Grid):
        # The gate (mimo.train.gate.check_layout) refused every layout that breaks these.
        assert (encoder.offset, encoder.size) == (language.offset, language.size), "grids on the same ranks"
        assert encoder.pp == language.pp == 1 and encoder.cp == 1, "pp=1 on both sides, cp=1 on the encoder's"
        self.encoder, self.language = encoder, language
        e_dp, l_dp = encoder.dp, language.dp
        self.direction = "equal" if e_dp == l_dp else ("fan_in" if e_dp > l_dp else "fan_out")
        self.strides = {"encoder": encoder.size // e_dp, "language": language.size // l_dp}
        self.block = math.lcm(*self.strides.values())
        self.group: dist.ProcessGroup | None = None
        self.members: list[int] = []
        self.index = 0
        if self.direction != "equal":
            self._build_groups()

    def _build_groups(self) -> None:
        """Collective: every rank creates every bridge group in the same order."""
        groups = peer_groups(self.encoder, self.language)
        self.group, self.index = member_group(groups)
        self.members = next(g for g in groups if g[self.index] == dist.get_rank())

    def _lanes(self, side: str) -> list[int]:
        """Each member's lane of `side`, counted from its block's first lane."""
        base = (self.members[0] - self.encoder.offset) // self.block * self.block + self.encoder.offset
        return [(r - base) // self.strides[side] for r in self.members]

    def to_language(self, rows: torch.Tensor, counts: torch.Tensor,
                    microbatch_rows: list[int] | None = None) -> torch.Tensor:
        """Collective: encoder-replica rows -> the rows of this LM replica's samples (`counts[s]` for sample s)."""
        return self._cross(rows, counts, "encoder", "language", microbatch_rows)

    def to_encoder(self, rows: torch.Tensor, counts: torch.Tensor,
                   microbatch_rows: list[int] | None = None) -> torch.Tensor:
        """Collective: rows of this LM replica's samples (`counts[s]` for sample s) -> the encoder replica's."""
        return self._cross(rows, counts, "language", "encoder", microbatch_rows)

    def _exchanged_rows(self, rows: torch.Tensor, counts: torch.Tensor) -> tuple[list[int], list[int]]:
        """Collective (one all-gather and a host sync): (the block's samples' row ends, each member's rows)."""
        mine = torch.cat([counts.long().reshape(-1), counts.new_tensor([rows.shape[0]]).long()]).to(rows.device)
        parts = [torch.empty_like(mine) for _ in self.members]
        dist.all_gather(parts, mine, group=self.group)
        per_lane = {lane: parts[k][:-1] for k, lane in reversed(list(enumerate(self._lanes("language"))))}
        ends = torch.cat([mine.new_zeros(1), torch.cat([per_lane[j] for j in sorted(per_lane)]).cumsum(0)]).tolist()
        return ends, [int(p[-1]) for p in parts]

    def _lane_rows(self, microbatch_rows: list[int]) -> int:
        """Rows of this rank's LM lane's samples, from every sample's rows of the microbatch (pure)."""
        per_lane = len(microbatch_rows) // self.language.dp
        lane = (dist.get_rank() - self.language.offset) // self.strides["language"]
        return sum(microbatch_rows[lane * per_lane: (lane + 1) * per_lane])

    def _block_ends(self, microbatch_rows: list[int]) -> list[int]:
        """The block's samples' row ends, cut from every sample's rows of the microbatch (pure)."""
        per_lane = len(microbatch_rows) // self.language.dp
        lanes_per_block = self.block // self.strides["language"]
        first = (self.members[0] - self.language.offset) // self.block * lanes_per_block
        block = microbatch_rows[first * per_lane: (first + lanes_per_block) * per_lane]
        return [0, *itertools.accumulate(block)]

    def _cross(self, rows: torch.Tensor, counts: torch.Tensor, source: str, dest: str,
               microbatch_rows: list[int] | None) -> torch.Tensor:
        """The move. With `microbatch_rows` (host ints, the same on every rank) the row counts need no
        exchange: one all-gather of the rows, no host sync; without, one more all-gather of the counts. The
        batch checks (mimo.data.checks) matched every sample's inputs to its placeholders on every rank
        before, so with `microbatch_rows` a replica holding other rows than its samples need raises alone."""
        if self.direction == "equal":
            need = int(counts.sum()) if microbatch_rows is None else self._lane_rows(microbatch_rows)
            if rows.shape[0] != need:
                raise ValueError(f"bridge: {source} rows ({rows.shape[0]}) do not match the LM batch's {need} rows")
            return rows
        lanes = {side: self._lanes(side) for side in (source, dest)}
        if microbatch_rows is None:
            ends, held = self._exchanged_rows(rows, counts)
        else:
            ends, held = self._block_ends(microbatch_rows), None
        samples = len(ends) - 1
        width = {side: samples // (self.block // self.strides[side]) for side in lanes}

        def span(side: str, lane: int) -> tuple[int, int]:
            return ends[lane * width[side]], ends[(lane + 1) * width[side]]

        want = [span(source, lane)[1] - span(source, lane)[0] for lane in lanes[source]]
        if held is None and rows.shape[0] != want[self.index]:
            held = [rows.shape[0] if k == self.index else n for k, n in enumerate(want)]
        if held is not None and held != want:
            raise ValueError(f"bridge ({self.direction}): the {source} replicas hold {held} rows but their samples "
                             f"need {want} (the LM batches' per-sample counts); every sample's inputs must give "
                             "exactly its placeholders")
        first = {side: [lanes[side].index(lane) for lane in sorted(set(lanes[side]))] for side in lanes}
        there = _Move(self.group, want, first[source], span(dest, lanes[dest][self.index]))
        sizes_back = [span(dest, lane)[1] - span(dest, lane)[0] for lane in lanes[dest]]
        back = _Move(self.group, sizes_back, first[dest], span(source, lanes[source][self.index]))
        return _MoveRows.apply(rows, there, back)
