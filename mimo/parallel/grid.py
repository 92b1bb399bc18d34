"""A grid: one module's contiguous rank range factored into named parallel dims.

The pure part (`Grid`) answers "which ranks share a tp/cp/dp/pp group" with plain integers, so
layouts can be validated and tested without processes. This file is the only place that creates
process groups: `Grid.build` turns a grid's rank lists into groups (the result, `GridGroups`, is what
the rest of `parallel/` asks for groups, coordinates and device meshes); `member_group` makes the
colocated bridges' groups and `pair_groups` the pipeline's two-rank links.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from mimo.parallel.comm import collective_device
from mimo.parallel.runtime import group_timeout

DIMS: tuple[str, ...] = ("tp", "cp", "dp", "pp")
"""Grid order: tp varies fastest (stays inside a node), pp slowest."""

BUILT_DIMS: tuple[tuple[str, ...], ...] = (
    ("tp",), ("cp",), ("dp",), ("pp",), ("cp", "dp"), ("tp", "cp"), ("tp", "cp", "dp"), DIMS,
)
"""The dim sets `Grid.build` creates groups for, in creation order (same on every rank)."""

Dims = str | tuple[str, ...]
Pair = tuple[int, int]


def canonical_dims(dims: Dims) -> tuple[str, ...]:
    """Put a dim set in grid order, so ("dp", "cp") and ("cp", "dp") name the same groups."""
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    for d in names:
        if d not in DIMS:
            raise ValueError(f"unknown grid dim '{d}'; dims are {', '.join(DIMS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"grid dims {names} repeat a dim; name each dim once")
    return tuple(d for d in DIMS if d in names)


@dataclass(frozen=True)
class Grid:
    """Ranks [offset, offset + size) laid out as tp x cp x dp x pp, tp fastest."""

    offset: int = 0
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ValueError(f"grid offset must be >= 0, got {self.offset}")
        for d in DIMS:
            if getattr(self, d) < 1:
                raise ValueError(f"grid {d} must be >= 1, got {getattr(self, d)}")

    @property
    def degrees(self) -> dict[str, int]:
        return {d: getattr(self, d) for d in DIMS}

    @property
    def size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def end(self) -> int:
        """One past the last rank."""
        return self.offset + self.size

    @property
    def ranks(self) -> list[int]:
        return list(range(self.offset, self.end))

    def contains(self, rank: int) -> bool:
        return self.offset <= rank < self.end

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's coordinate along each dim."""
        if not self.contains(rank):
            raise ValueError(f"rank {rank} is not in the grid of ranks {self.offset}..{self.end - 1}")
        local, out = rank - self.offset, {}
        for d in DIMS:
            local, out[d] = divmod(local, getattr(self, d))
        return out

    def rank_of(self, **coords: int) -> int:
        """Global rank at these coordinates; a dim left out is taken as 0."""
        canonical_dims(tuple(coords))
        rank, stride = self.offset, 1
        for d in DIMS:
            c, n = coords.get(d, 0), getattr(self, d)
            if not 0 <= c < n:
                raise ValueError(f"coordinate {d}={c} is outside the grid's {d}={n}; use 0..{n - 1}")
            rank += c * stride
            stride *= n
        return rank

    def _walk(self, dims: tuple[str, ...]) -> Iterator[dict[str, int]]:
        """All coordinate combinations of `dims`, earliest dim in grid order fastest."""
        for combo in itertools.product(*(range(getattr(self, d)) for d in reversed(dims))):
            yield dict(zip(reversed(dims), combo))

    def rank_groups(self, dims: Dims) -> list[list[int]]:
        """Every group of ranks that differ only along `dims`.

        Groups come in ascending order of their first rank and each group is ascending, so a
        rank's index in its group is its position along `dims` (earliest grid dim fastest).
        """
        varying = canonical_dims(dims)
        fixed = tuple(d for d in DIMS if d not in varying)
        return [[self.rank_of(**f, **v) for v in self._walk(varying)] for f in self._walk(fixed)]

    def expert_groups(self, ep: int) -> dict[str, list[list[int]]]:
        """MoE view of the dp dim (experts are carved out of data parallelism only).

        "ep": every run of `ep` consecutive dp ranks of one (tp, cp, pp) coordinate, the i-th rank holding
        the i-th 1/ep of the experts; tokens are exchanged inside it. "edp": the ranks holding the same
        experts with different tokens (same tp, pp and index in its ep group; every cp and dp // ep), over
        which those experts' gradients are summed. TP ranks hold the same tokens, so they are never in one
        ep group; they keep TP-replicated copies of their experts.
        """
        if ep < 1 or self.dp % ep:
            raise ValueError(f"expert parallel ep={ep} must be >= 1 and divide dp={self.dp}; choose a divisor of "
                             f"{self.dp}")
        ep_groups = [g[i:i + ep] for g in self.rank_groups("dp") for i in range(0, self.dp, ep)]
        lanes = self.rank_groups(("cp", "dp"))  # index in a lane: cp + self.cp * dp
        edp = [[r for j, r in enumerate(lane) if (j // self.cp) % ep == e] for lane in lanes for e in range(ep)]
        return {"ep": ep_groups, "edp": edp}

    def build_expert(self, ep: int, name: str = "grid") -> tuple[ProcessGroup | None, ProcessGroup | None]:
        """Create the `expert_groups(ep)` process groups; return this rank's (ep group, edp group), None where
        this rank is not in the grid. Collective: every rank of the world calls it with the same `ep`."""
        world = dist.get_world_size()
        groups = self.expert_groups(ep)
        return tuple(_new_groups(tuple(tuple(g) for g in groups[k]), world, f"{name}:{k}") for k in ("ep", "edp"))

    def build(self, name: str = "grid") -> GridGroups:
        """Create this grid's process groups for every dim set in BUILT_DIMS.

        Collective: every rank of the world calls it (members or not), for every grid, in the same
        order. Dim sets that enumerate the same rank groups share one process group. A grid of one rank in a
        process without torch.distributed (one process) has none to create: each of its groups is None and of
        size 1, and every collective over a group of size 1 is skipped by its caller.
        """
        if self.size == 1 and not dist.is_initialized():
            return GridGroups(self, self.offset, dict.fromkeys(BUILT_DIMS))
        if not dist.is_initialized():
            raise RuntimeError("Grid.build needs torch.distributed; call dist.init_process_group first")
        world = dist.get_world_size()
        if self.end > world:
            raise ValueError(f"grid '{name}' spans ranks {self.offset}..{self.end - 1} but the world has "
                             f"{world} ranks; shrink the grid or launch more processes")
        made: dict[tuple[tuple[int, ...], ...], ProcessGroup | None] = {}
        groups: dict[tuple[str, ...], ProcessGroup | None] = {}
        for dims in BUILT_DIMS:
            enum = tuple(tuple(g) for g in self.rank_groups(dims))
            if enum not in made:
                made[enum] = _new_groups(enum, world, f"{name}:{'_'.join(dims)}")
            groups[dims] = made[enum]
        return GridGroups(self, dist.get_rank(), groups)


def _new_groups(enum: tuple[tuple[int, ...], ...], world: int, desc: str) -> ProcessGroup | None:
    """Collective: create one group per rank list; return this rank's (the world group is reused)."""
    if enum == (tuple(range(world)),):
        return dist.group.WORLD
    return dist.new_subgroups_by_enumeration([list(g) for g in enum], timeout=group_timeout(), group_desc=desc)[0]


@dataclass(frozen=True)
class GridGroups:
    """One rank's view of a built grid: its groups, coordinates and device meshes."""

    grid: Grid
    rank: int
    groups: dict[tuple[str, ...], ProcessGroup | None] = field(repr=False)

    @property
    def member(self) -> bool:
        return self.grid.contains(self.rank)

    def _require_member(self) -> None:
        if not self.member:
            raise RuntimeError(f"rank {self.rank} is not in the grid of ranks {self.grid.offset}.."
                               f"{self.grid.end - 1}; check membership with .member first")

    def _key(self, dims: Dims) -> tuple[str, ...]:
        key = canonical_dims(dims)
        if key not in self.groups:
            raise ValueError(f"no process group was built for dims {key}; built: {list(self.groups)}")
        return key

    def group(self, dims: Dims = DIMS) -> ProcessGroup | None:
        """The group over `dims` holding this rank; None where this rank is not in the grid, or where the grid
        has no process groups (one process, see `Grid.build`)."""
        return self.groups[self._key(dims)] if self.member else None

    def size_of(self, dims: Dims = DIMS) -> int:
        return math.prod(getattr(self.grid, d) for d in canonical_dims(dims))

    def rank_in(self, dims: Dims = DIMS) -> int:
        """This rank's index inside its group over `dims` (earliest grid dim fastest)."""
        self._require_member()
        coords, index, stride = self.grid.coords(self.rank), 0, 1
        for d in canonical_dims(dims):
            index += coords[d] * stride
            stride *= getattr(self.grid, d)
        return index

    def device_mesh(self, dims: Dims = DIMS) -> DeviceMesh:
        """A 1-D DeviceMesh over this rank's group on `dims` (for FSDP2 / DTensor).

        Not collective: it wraps the group that `build` already created.
        """
        key = self._key(dims)
        self._require_member()
        group = self.groups[key]
        device_type = collective_device(group).type
        return DeviceMesh.from_group(group, device_type, mesh_dim_names=("_".join(key),))

    def plane_mesh(self, outer: str, inner: str) -> DeviceMesh:
        """A 2-D DeviceMesh (`outer`, `inner`) over the ranks sharing this rank's other coordinates, e.g.
        ("tp", "dp"): where FSDP shards each tensor-parallel chunk over dp (for DTensor views of checkpoints).

        Not collective: it wraps the two 1-D groups that `build` already created.
        """
        self._require_member()
        coords = self.grid.coords(self.rank)
        plane = [[self.grid.rank_of(**{**coords, outer: i, inner: j}) for j in range(getattr(self.grid, inner))]
                 for i in range(getattr(self.grid, outer))]
        groups = [self.groups[self._key(outer)], self.groups[self._key(inner)]]
        return DeviceMesh.from_group(groups, collective_device(groups[0]).type, mesh=plane,
                                     mesh_dim_names=(outer, inner))

    @property
    def is_first_stage(self) -> bool:
        """True on pp stage 0; False where this rank is not in the grid."""
        return self.member and self.grid.coords(self.rank)["pp"] == 0

    @property
    def is_last_stage(self) -> bool:
        """True on the last pp stage; False where this rank is not in the grid."""
        return self.member and self.grid.coords(self.rank)["pp"] == self.grid.pp - 1


def member_group(rank_lists: list[list[int]]) -> tuple[ProcessGroup | None, int]:
    """Collective over the world: one process group per rank list, created in list order.

    Every rank must pass the same lists. Returns this rank's group and its index in that group's
    list (None and 0 where no list holds this rank).
    """
    rank = dist.get_rank()
    mine, index = None, 0
    for ranks in rank_lists:
        group = dist.new_group(ranks, timeout=group_timeout())
        if rank in ranks:
            mine, index = group, ranks.index(rank)
    return mine, index


def pair_groups(pairs: list[Pair]) -> dict[Pair, ProcessGroup]:
    """Collective over the world: one two-rank group per (src, dst) pair, created in list order.

    Every rank must pass the same list. Returns the groups this rank belongs to, keyed by pair.
    """
    rank = dist.get_rank()
    out = {}
    for src, dst in pairs:
        if src == dst:
            raise ValueError(f"a pipeline link needs two different ranks, got {src} -> {dst}")
        group = dist.new_group(sorted((src, dst)), timeout=group_timeout())
        if rank in (src, dst):
            out[(src, dst)] = group
    return out
