"""Colocated bridge: exact forward and adjoint for fan-in, fan-out and equal, with variable row counts."""

import pytest
import torch

from mimo.parallel.bridge.colocated import ColocatedBridge
from mimo.parallel.grid import Grid
from tests.support.dist import run_distributed

H = 3


def _rows(lane: int, n: int) -> torch.Tensor:
    """Rows that name their owner lane and their index, so misplaced rows are visible."""
    return torch.arange(n, dtype=torch.float32)[:, None] + 100.0 * (lane + 1) + torch.zeros(n, H)


def test_peer_groups_match_the_lane_arithmetic():
    fan_in = ColocatedBridge.__new__(ColocatedBridge)
    fan_in.encoder, fan_in.language = Grid(tp=2, dp=4), Grid(tp=4, dp=2)
    fan_in.direction, fan_in.scale = "fan_in", 2
    assert fan_in.peer_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    fan_out = ColocatedBridge.__new__(ColocatedBridge)
    fan_out.encoder, fan_out.language = Grid(tp=4, dp=2), Grid(tp=2, dp=4)
    fan_out.direction, fan_out.scale = "fan_out", 2
    assert fan_out.peer_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    wide = ColocatedBridge.__new__(ColocatedBridge)
    wide.encoder, wide.language = Grid(tp=1, dp=8), Grid(tp=4, dp=2)
    wide.direction, wide.scale = "fan_in", 4
    assert wide.peer_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_invalid_bridges_are_rejected_before_any_collective():
    """The gate refuses these layouts (tests/unit/test_gate.py); the bridge asserts them."""
    with pytest.raises(AssertionError, match="divide one another"):
        ColocatedBridge(Grid(tp=2, dp=3), Grid(tp=3, dp=2))
    with pytest.raises(AssertionError, match="same ranks"):
        ColocatedBridge(Grid(tp=2, dp=2), Grid(offset=4, tp=2, dp=2))
    with pytest.raises(AssertionError, match="pp=1"):
        ColocatedBridge(Grid(tp=2, dp=2), Grid(tp=2, pp=2))


# Variable rows per encoder lane (fan-in) and per LM lane (fan-out).
COUNTS = [3, 0, 2, 5, 1, 4, 2, 2]


def _bridge_cases(rank: int, world: int) -> None:
    # fan-in: encoder tp2 x dp4, LM tp4 x dp2 -> each LM lane gathers encoder lanes 2j, 2j+1
    br = ColocatedBridge(Grid(tp=2, dp=4), Grid(tp=4, dp=2))
    e_lane, l_lane = rank // 2, rank // 4
    x = _rows(e_lane, COUNTS[e_lane]).requires_grad_(True)
    expected = sum(COUNTS[2 * l_lane : 2 * l_lane + 2])
    y = br(x, expected)
    manual = torch.cat([_rows(e, COUNTS[e]) for e in (2 * l_lane, 2 * l_lane + 1)])
    assert torch.equal(y, manual)
    g = torch.arange(y.numel(), dtype=torch.float32).view_as(y) + 1000.0 * l_lane
    y.backward(g)
    start = sum(COUNTS[2 * l_lane : e_lane])
    assert torch.equal(x.grad, g[start : start + COUNTS[e_lane]])
    with pytest.raises(ValueError, match="fan-in bridge"):
        br(x, expected + 1)

    # fan-out: encoder tp4 x dp2, LM tp2 x dp4 -> encoder lane i feeds LM lanes 2i, 2i+1
    br = ColocatedBridge(Grid(tp=4, dp=2), Grid(tp=2, dp=4))
    e_lane, l_lane = rank // 4, rank // 2
    lm_counts = COUNTS[2 * e_lane : 2 * e_lane + 2]
    x = _rows(e_lane, sum(lm_counts)).requires_grad_(True)
    y = br(x, COUNTS[l_lane])
    slot = l_lane % 2
    start = sum(lm_counts[:slot])
    assert torch.equal(y, _rows(e_lane, sum(lm_counts))[start : start + COUNTS[l_lane]])
    # slot k's upstream gradient is all (k + 1): the adjoint must be [1..., 2...] in slot order
    y.backward(torch.full_like(y, slot + 1.0))
    want = torch.cat([torch.full((lm_counts[0], H), 1.0), torch.full((lm_counts[1], H), 2.0)])
    assert torch.equal(x.grad, want)

    # equal: a bitwise identity forward and backward
    br = ColocatedBridge(Grid(tp=2, dp=4), Grid(tp=2, dp=4))
    x = torch.randn(5, H, requires_grad=True)
    y = br(x, 5)
    assert y is x


def test_bridge_forward_and_adjoint_on_8_ranks():
    run_distributed(_bridge_cases, 8, timeout=120)
