"""The encoder -> LM crossing: the one place where tensors move from one module's ranks to another's.

Colocated layouts (SPEC 2.4): the encoder and the LM share every rank but each has its own TP and DP
degree, so a rank's *encoder replica* and its *LM replica* hold different slices of the microbatch.
Both sides slice the microbatch contiguously by DP rank, and with tp varying fastest a data lane of
the side with fewer replicas is a contiguous block of ranks that holds k = (larger DP / smaller DP)
lanes of the other side. The bridge moves encoder rows along the batch dimension inside that block:

- fan-in (encoder DP > LM DP): forward all-gathers the k encoder replicas' rows (in replica order,
  which is sample order); backward keeps this replica's slice of the gradient;
- fan-out (LM DP > encoder DP): forward keeps this LM replica's slice of the rows; backward
  all-gathers the k siblings' gradient slices (an all-gather, never zero padding);
- equal: identity.

Samples may carry different numbers of rows. Row counts travel with the rows: each forward first
all-gathers one integer per peer (fan-in: how many rows each encoder replica produced; fan-out: how
many rows each LM replica expects), so the slices are exact and the backward reuses them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mimo.parallel.grid import Grid, member_group


def _all_gather_int(value: int, group: dist.ProcessGroup, device: torch.device) -> list[int]:
    """Collective over `group`: every member's integer, in group-rank order."""
    t = torch.tensor([value], dtype=torch.long, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t, group=group)
    return [int(x) for x in out]


def _all_gather_rows(x: torch.Tensor, sizes: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """Collective over `group`: concatenate every member's rows (member i has sizes[i] rows)."""
    width = max(sizes)
    padded = x.new_zeros((width, *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)], dim=0)


class _GatherRows(torch.autograd.Function):
    """Forward: all-gather variable-size rows. Backward: this member's slice of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, sizes: list[int], index: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.start = sum(sizes[:index])
        ctx.n = sizes[index]
        return _all_gather_rows(x, sizes, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.narrow(0, ctx.start, ctx.n).contiguous(), None, None, None


class _SliceRows(torch.autograd.Function):
    """Forward: this member's slice of replicated rows. Backward: all-gather the members' gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, sizes: list[int], index: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.sizes, ctx.group = sizes, group
        return x.narrow(0, sum(sizes[:index]), sizes[index]).contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_gather_rows(grad.contiguous(), ctx.sizes, ctx.group), None, None, None


class ColocatedBridge:
    """Re-partitions one modality's encoder rows from the encoder grid's DP layout to the LM grid's.

    Build it on every rank, in the same order (group creation is collective). Call it with the
    encoder replica's rows and the number of rows this rank's LM replica expects (its placeholder
    count); the call is collective over the rank's bridge group.
    """

    def __init__(self, encoder: Grid, language: Grid):
        # The gate (mimo.train.gate.check_layout) refused every layout that breaks these.
        e_dp, l_dp = encoder.dp, language.dp
        assert (encoder.offset, encoder.size) == (language.offset, language.size), "grids on the same ranks"
        assert encoder.pp == language.pp == 1 and encoder.cp == 1, "pp=1 on both sides, cp=1 on the encoder's"
        assert max(e_dp, l_dp) % min(e_dp, l_dp) == 0, "dp degrees that divide one another"
        self.encoder, self.language = encoder, language
        self.direction = "equal" if e_dp == l_dp else ("fan_in" if e_dp > l_dp else "fan_out")
        self.scale = max(e_dp, l_dp) // min(e_dp, l_dp)
        self.group: dist.ProcessGroup | None = None
        self.index = 0
        if self.direction != "equal":
            self._build_groups()

    def peer_groups(self) -> list[list[int]]:
        """The bridge groups as rank lists, in creation order (pure, no collectives)."""
        if self.direction == "equal":
            return []
        # The side with more DP lanes contributes one rank per lane; peers share that side's tp index
        # and the other side's lane.
        many, few = (self.encoder, self.language) if self.direction == "fan_in" else (self.language, self.encoder)
        groups = []
        lane = few.size // few.dp
        stride = many.size // many.dp
        for base in range(few.offset, few.end, lane):
            for t in range(stride):
                groups.append([base + j * stride + t for j in range(self.scale)])
        return groups

    def _build_groups(self) -> None:
        """Collective: every rank creates every bridge group in the same order."""
        self.group, self.index = member_group(self.peer_groups())

    def __call__(self, rows: torch.Tensor, expected_rows: int) -> torch.Tensor:
        """Collective over this rank's bridge group: encoder-replica rows -> LM-replica rows."""
        if self.direction == "equal":
            if rows.shape[0] != expected_rows:
                raise ValueError(f"encoder produced {rows.shape[0]} rows but the LM batch holds {expected_rows} "
                                 "placeholders")
            return rows
        if self.direction == "fan_in":
            sizes = _all_gather_int(rows.shape[0], self.group, rows.device)
            if sum(sizes) != expected_rows:
                raise ValueError(f"fan-in bridge: encoder replicas produced {sizes} rows (total {sum(sizes)}) but "
                                 f"this LM replica's batch holds {expected_rows} placeholders")
            return _GatherRows.apply(rows, sizes, self.index, self.group)
        sizes = _all_gather_int(expected_rows, self.group, rows.device)
        if sum(sizes) != rows.shape[0]:
            raise ValueError(f"fan-out bridge: LM replicas expect {sizes} rows (total {sum(sizes)}) but the "
                             f"encoder replica produced {rows.shape[0]}")
        return _SliceRows.apply(rows, sizes, self.index, self.group)
