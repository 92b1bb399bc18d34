"""Bridge arithmetic and refusals that need no process group."""

import pytest

from mimo.parallel.bridge.colocated import ColocatedBridge, peer_groups
from mimo.parallel.grid import Grid


def test_peer_groups_match_the_lane_arithmetic():
    assert peer_groups(Grid(tp=2, dp=4), Grid(tp=4, dp=2)) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert peer_groups(Grid(tp=4, dp=2), Grid(tp=2, dp=4)) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert peer_groups(Grid(tp=1, dp=8), Grid(tp=4, dp=2)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert peer_groups(Grid(tp=2, dp=3), Grid(tp=3, dp=2)) == [[0, 1, 2, 3, 4, 5]]
    assert peer_groups(Grid(tp=2, dp=4), Grid(tp=2, dp=4)) == []


def test_invalid_bridges_are_rejected_before_any_collective():
    """The gate refuses these layouts (tests/unit/test_gate.py); the bridge asserts them."""
    with pytest.raises(AssertionError, match="same ranks"):
        ColocatedBridge(Grid(tp=2, dp=2), Grid(offset=4, tp=2, dp=2))
    with pytest.raises(AssertionError, match="pp=1"):
        ColocatedBridge(Grid(tp=2, dp=2), Grid(tp=2, pp=2))
