"""Grids built into process groups on 4 and 8 gloo ranks: each group holds the ranks the arithmetic says."""

import pytest
import torch
import torch.distributed as dist

from mimo.parallel.grid import BUILT_DIMS, Grid
from tests.support.dist import run_distributed


def _check_built(grid: Grid, rank: int) -> None:
    """Build `grid` (collective) and check every group by summing 2**rank over it."""
    built = grid.build()
    if not grid.contains(rank):
        assert all(built.group(d) is None for d in BUILT_DIMS)
        assert not built.is_first_stage and not built.is_last_stage
        with pytest.raises(RuntimeError, match=f"rank {rank} is not in the grid"):
            built.device_mesh("dp")
        return
    for dims in BUILT_DIMS:
        expected = next(g for g in grid.rank_groups(dims) if rank in g)
        group = built.group(dims)
        x = torch.tensor([1 << rank])
        dist.all_reduce(x, group=group)
        assert x.item() == sum(1 << r for r in expected), (dims, expected)
        assert dist.get_world_size(group) == built.size_of(dims) == len(expected)
        assert dist.get_rank(group) == built.rank_in(dims) == expected.index(rank)
    mesh = built.device_mesh(("dp", "cp"))
    assert mesh.device_type == "cpu" and mesh.mesh_dim_names == ("cp_dp",)
    assert mesh.size() == grid.cp * grid.dp and mesh.get_local_rank() == built.rank_in(("cp", "dp"))
    pp = grid.coords(rank)["pp"]
    assert (built.is_first_stage, built.is_last_stage) == (pp == 0, pp == grid.pp - 1)


def _build_on_4(rank: int, world_size: int) -> None:
    for grid in (Grid(tp=2, dp=2), Grid(dp=2, pp=2), Grid(offset=2, tp=2), Grid(offset=3), Grid(dp=4)):
        _check_built(grid, rank)
    with pytest.raises(ValueError, match="grid 'big' spans ranks 2..5 but the world has 4 ranks"):
        Grid(offset=2, tp=4).build("big")
    with pytest.raises(ValueError, match="no process group was built for dims \\('tp', 'pp'\\)"):
        Grid(dp=4).build().group(("pp", "tp"))


def _build_on_8(rank: int, world_size: int) -> None:
    for grid in (Grid(tp=2, dp=4), Grid(tp=2, dp=2, pp=2), Grid(tp=2, cp=2, dp=2), Grid(offset=4, cp=2, pp=2)):
        _check_built(grid, rank)


@pytest.mark.slow
def test_build_on_4_processes():
    run_distributed(_build_on_4, 4)


@pytest.mark.slow
def test_build_on_8_processes():
    run_distributed(_build_on_8, 8)
