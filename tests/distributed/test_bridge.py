"""Colocated bridge: exact moves both ways (encoder rows to the LM, generation rows to the encoder) and their
backward, for fan-in, fan-out, DP degrees that do not divide each other, and equal, with rows per sample that
vary (some samples have none)."""

import pytest
import torch
import torch.distributed as dist

from mimo.parallel.bridge.colocated import ColocatedBridge
from mimo.parallel.grid import Grid
from tests.support.dist import run_distributed

H = 3
SAMPLES = 24  # per microbatch: every DP degree below divides it
ROWS = [3, 0, 2, 5, 1, 4, 2, 2, 0, 0, 1, 3, 2, 1, 0, 4, 1, 1, 2, 0, 3, 1, 0, 2]


def _rows(first: int, stop: int) -> torch.Tensor:
    """The rows of samples [first, stop), each naming its sample and its index, so misplaced rows show."""
    return torch.cat([torch.arange(ROWS[s], dtype=torch.float32)[:, None] + 100.0 * (s + 1) + torch.zeros(ROWS[s], H)
                      for s in range(first, stop)])


def _samples(grid: Grid, rank: int) -> tuple[int, int]:
    """The samples of `rank`'s lane of `grid`."""
    lane, per = (rank - grid.offset) // (grid.size // grid.dp), SAMPLES // grid.dp
    return lane * per, (lane + 1) * per


class _CountGathers:
    """Counts dist.all_gather calls and host reads of tensors (`tolist`) while active."""

    def __enter__(self):
        self.gathers = self.host_reads = 0
        self.saved = dist.all_gather, torch.Tensor.tolist

        def gather(*a, **kw):
            self.gathers += 1
            return self.saved[0](*a, **kw)

        def tolist(t):
            self.host_reads += 1
            return self.saved[1](t)

        dist.all_gather, torch.Tensor.tolist = gather, tolist
        return self

    def __exit__(self, *exc):
        dist.all_gather, torch.Tensor.tolist = self.saved


def _moves_both_ways(rank: int, encoder: Grid, language: Grid, hinted: bool = False) -> tuple[int, int]:
    """Both moves and their backward, checked row by row; returns (all-gathers, host reads) of the forwards."""
    bridge = ColocatedBridge(encoder, language)
    enc, lm = _samples(encoder, rank), _samples(language, rank)
    counts = torch.tensor(ROWS[lm[0] : lm[1]])
    seen = [0, 0]
    for source, dest, move in ((enc, lm, bridge.to_language), (lm, enc, bridge.to_encoder)):
        x = _rows(*source).requires_grad_(True)
        with _CountGathers() as counted:
            y = move(x, counts, ROWS if hinted else None)
        seen = [seen[0] + counted.gathers, seen[1] + counted.host_reads]
        assert torch.equal(y, _rows(*dest)), (rank, encoder, language, move.__name__)
        # A gradient that is a function of each row alone: the backward must give every source row its own.
        (y * y).sum().backward()
        assert torch.equal(x.grad, 2 * x.detach()), (rank, encoder, language, move.__name__)
    if bridge.direction != "equal" and not hinted:
        with pytest.raises(ValueError, match="replicas hold"):
            bridge.to_language(_rows(*enc), counts + (torch.arange(len(counts)) == 0))
    return seen[0], seen[1]


def _bridge_cases(rank: int, world: int, pairs: list[tuple[Grid, Grid]], hinted: bool = False) -> list:
    return [_moves_both_ways(rank, encoder, language, hinted) for encoder, language in pairs]


def test_bridge_moves_and_backward_on_8_ranks():
    pairs = [(Grid(tp=2, dp=4), Grid(tp=4, dp=2)), (Grid(tp=4, dp=2), Grid(tp=2, dp=4)),
             (Grid(tp=1, dp=8), Grid(tp=4, dp=2)), (Grid(tp=2, dp=4), Grid(tp=2, dp=4))]
    run_distributed(_bridge_cases, 8, pairs, timeout=180)


def test_bridge_moves_samples_by_ranges_when_dp_degrees_do_not_divide():
    """Encoder tp2 x dp3 and LM tp3 x dp2 on 6 ranks: LM lane 0 takes encoder lane 0 and half of lane 1."""
    run_distributed(_bridge_cases, 6, [(Grid(tp=2, dp=3), Grid(tp=3, dp=2)), (Grid(tp=3, dp=2), Grid(tp=1, dp=6))],
                    timeout=180)


def test_host_row_counts_spare_the_bridge_its_count_exchange_and_host_sync():
    """With every sample's rows of the microbatch given on the host (what ParallelPlan.microbatches derives from
    the global batch), a move is the rows' all-gather alone: the same rows and gradients as with the count
    exchange, one all-gather instead of two per crossing and no host read of a tensor."""
    pairs = [(Grid(tp=1, dp=8), Grid(tp=4, dp=2)), (Grid(tp=4, dp=2), Grid(tp=2, dp=4)),
             (Grid(tp=2, dp=4), Grid(tp=2, dp=4))]
    exchanged = run_distributed(_bridge_cases, 8, pairs, False, timeout=180)
    hinted = run_distributed(_bridge_cases, 8, pairs, True, timeout=180)
    for rank in range(8):
        # Two crossings per case (to the LM, to the encoder); the equal-DP case moves nothing.
        assert exchanged[rank] == [(4, 2), (4, 2), (0, 0)], exchanged[rank]
        assert hinted[rank] == [(2, 0), (2, 0), (0, 0)], hinted[rank]
