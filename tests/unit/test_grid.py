"""Grid rank arithmetic against hand-written groups."""

import pytest

from mimo.parallel.grid import BUILT_DIMS, DIMS, Grid

TP2_DP4 = Grid(tp=2, dp=4)
TP2_CP2_DP2_AT4 = Grid(offset=4, tp=2, cp=2, dp=2)
TP2_DP2_PP2 = Grid(tp=2, dp=2, pp=2)


def test_tp2_dp4_groups():
    assert TP2_DP4.rank_groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert TP2_DP4.rank_groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert TP2_DP4.rank_groups("cp") == [[r] for r in range(8)]
    assert TP2_DP4.rank_groups(("tp", "cp", "dp")) == [list(range(8))]


def test_tp2_cp2_dp2_with_offset():
    g = TP2_CP2_DP2_AT4
    assert (g.size, g.ranks) == (8, list(range(4, 12)))
    assert g.rank_groups("tp") == [[4, 5], [6, 7], [8, 9], [10, 11]]
    assert g.rank_groups("cp") == [[4, 6], [5, 7], [8, 10], [9, 11]]
    assert g.rank_groups("dp") == [[4, 8], [5, 9], [6, 10], [7, 11]]
    assert g.rank_groups(("dp", "cp")) == [[4, 6, 8, 10], [5, 7, 9, 11]]
    assert g.rank_groups(("tp", "cp")) == [[4, 5, 6, 7], [8, 9, 10, 11]]


def test_tp2_dp2_pp2_groups():
    g = TP2_DP2_PP2
    assert g.rank_groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g.rank_groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g.rank_groups(("tp", "pp")) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert g.rank_groups(("tp", "cp", "dp")) == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("grid", [TP2_DP4, TP2_CP2_DP2_AT4, TP2_DP2_PP2, Grid(offset=3), Grid(tp=3, pp=2)])
def test_groups_partition_the_grid(grid: Grid):
    for dims in BUILT_DIMS:
        groups = grid.rank_groups(dims)
        assert sorted(r for g in groups for r in g) == grid.ranks
        assert all(len(g) == len(groups[0]) for g in groups)
        assert groups == sorted(sorted(g) for g in groups)


def test_dims_are_canonical():
    assert TP2_DP4.rank_groups(("dp", "tp")) == TP2_DP4.rank_groups(("tp", "dp"))
    assert BUILT_DIMS[-1] == DIMS


def test_coords_round_trip():
    g = Grid(offset=2, tp=2, cp=3, dp=2, pp=2)
    for r in g.ranks:
        assert g.rank_of(**g.coords(r)) == r
    assert g.coords(2 + 1 + 2 * 2 + 6 * 1 + 12 * 1) == {"tp": 1, "cp": 2, "dp": 1, "pp": 1}
    assert g.rank_of(pp=1) == 14
    assert g.contains(25) and not g.contains(26) and not g.contains(1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="grid tp must be >= 1, got 0"):
        Grid(tp=0)
    with pytest.raises(ValueError, match="offset must be >= 0"):
        Grid(offset=-1)
    with pytest.raises(ValueError, match="unknown grid dim 'ep'; dims are tp, cp, dp, pp"):
        TP2_DP4.rank_groups(("tp", "ep"))
    with pytest.raises(ValueError, match="repeat"):
        TP2_DP4.rank_groups(("tp", "tp"))
    with pytest.raises(ValueError, match="dp=4 is outside the grid's dp=4; use 0..3"):
        TP2_DP4.rank_of(dp=4)
    with pytest.raises(ValueError, match="rank 8 is not in the grid of ranks 0..7"):
        TP2_DP4.coords(8)


def test_expert_groups():
    """ep is carved out of dp: an ep group never spans tp (TP ranks hold the same tokens); edp spans cp."""
    assert TP2_DP4.expert_groups(2) == {
        "ep": [[0, 2], [4, 6], [1, 3], [5, 7]],
        "edp": [[0, 4], [2, 6], [1, 5], [3, 7]],
    }
    assert TP2_DP4.expert_groups(4) == {"ep": [[0, 2, 4, 6], [1, 3, 5, 7]],
                                        "edp": [[0], [2], [4], [6], [1], [3], [5], [7]]}
    assert Grid(cp=2, dp=2).expert_groups(2) == {"ep": [[0, 2], [1, 3]], "edp": [[0, 1], [2, 3]]}
    assert TP2_DP2_PP2.expert_groups(2)["ep"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    with pytest.raises(ValueError, match="ep=3 must be >= 1 and divide dp=4"):
        TP2_DP4.expert_groups(3)
