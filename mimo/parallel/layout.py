"""Which ranks run which module: a map module -> Grid. Its checks (pure arithmetic, a `ConfigError` naming
the field) are the first part of the gate's layout check, before any process group exists."""

from __future__ import annotations

from dataclasses import dataclass

from mimo.config.schema import ConfigError, ModuleLayoutConfig
from mimo.parallel.grid import Grid

_FIX = ("grids must span identical ranks (colocated) or be pairwise disjoint (non-colocated); "
        "set parallel.modules.<name>.offset/size accordingly")


def _span(lo: int, end: int) -> str:
    """Human form of the rank range [lo, end)."""
    return f"rank {lo}" if end - lo == 1 else f"ranks {lo}..{end - 1}"


@dataclass(frozen=True)
class StageInfo:
    """Whether a rank holds its module's first and/or last pipeline stage."""

    first: bool
    last: bool


@dataclass(frozen=True)
class Role:
    """What one rank holds: per module it runs (in layout order), its pipeline stage position."""

    rank: int
    stages: dict[str, StageInfo]

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(self.stages)

    def holds(self, name: str) -> bool:
        return name in self.stages


@dataclass(frozen=True)
class Layout:
    """Module name -> Grid over a world of `world_size` ranks; validated on construction."""

    grids: dict[str, Grid]
    world_size: int

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Reject layouts that cannot run. Pure: raises the same ConfigError on every rank."""
        if self.world_size < 1:
            raise ConfigError(f"world size must be >= 1, got {self.world_size}")
        if not self.grids:
            raise ConfigError("the layout has no modules; give at least one module a grid")
        for name, g in self.grids.items():
            if g.end > self.world_size:
                raise ConfigError(f"grid of '{name}' spans {_span(g.offset, g.end)} but the world has "
                                 f"{self.world_size} ranks; shrink its offset/size or launch more processes")
        self._check_sharing()
        self._check_coverage()

    def _check_sharing(self) -> None:
        items = list(self.grids.items())
        for i, (a, ga) in enumerate(items):
            for b, gb in items[i + 1:]:
                same = (ga.offset, ga.end) == (gb.offset, gb.end)
                if not same and ga.offset < gb.end and gb.offset < ga.end:
                    raise ConfigError(f"grids of '{a}' ({_span(ga.offset, ga.end)}) and '{b}' "
                                     f"({_span(gb.offset, gb.end)}) partially overlap; {_FIX}")
        spans = {(g.offset, g.end) for g in self.grids.values()}
        if 1 < len(spans) < len(self.grids):
            shown = ", ".join(f"'{n}' on {_span(g.offset, g.end)}" for n, g in items)
            raise ConfigError(f"some grids share ranks and others do not ({shown}); {_FIX}")

    def _check_coverage(self) -> None:
        covered = {r for g in self.grids.values() for r in g.ranks}
        top = max(covered) + 1
        holes = set(range(top)) - covered
        if holes:
            lo = min(holes)
            hi = min(r for r in covered if r > lo)
            raise ConfigError(f"no module's grid covers {_span(lo, hi)} (a gap); every rank must hold a "
                             "module: move a grid's offset or grow its size")
        if top != self.world_size:
            raise ConfigError(f"the grids cover {_span(0, top)} but the world has {self.world_size} ranks; "
                             f"launch {top} processes or grow the grids to cover the world")

    @property
    def colocated(self) -> bool:
        """True when every module runs on the same ranks."""
        return len({(g.offset, g.end) for g in self.grids.values()}) == 1

    def role(self, rank: int) -> Role:
        """Which modules `rank` holds and where it sits in each one's pipeline."""
        stages = {}
        for name, g in self.grids.items():
            if g.contains(rank):
                pp = g.coords(rank)["pp"]
                stages[name] = StageInfo(first=pp == 0, last=pp == g.pp - 1)
        if not stages:
            raise RuntimeError(f"rank {rank} is in no module's grid (world of {self.world_size} ranks); "
                               "launch exactly world_size processes")
        return Role(rank, stages)

    @classmethod
    def from_config(cls, modules: dict[str, ModuleLayoutConfig], module_names: list[str],
                    world_size: int) -> Layout:
        """Grids from `parallel.modules`; a module without an entry runs on all ranks as pure DP."""
        for name in modules:
            if name not in module_names:
                raise ConfigError(f"parallel.modules.{name} names no module; modules are: "
                                 f"{', '.join(module_names)}")
        grids = {n: _grid(n, modules.get(n, ModuleLayoutConfig()), world_size) for n in module_names}
        defaulted = [n for n in module_names if n not in modules]
        try:
            return cls(grids, world_size)
        except ConfigError as e:
            if modules and defaulted:
                raise ConfigError(f"{e} (note: {', '.join(defaulted)} had no parallel.modules entry and "
                                 "defaulted to all ranks as pure DP)") from None
            raise


def _grid(name: str, m: ModuleLayoutConfig, world_size: int) -> Grid:
    """One module's Grid; dp is what is left of size after tp*cp*pp; size 0 means the whole world."""
    key = f"parallel.modules.{name}"
    for field in ("tp", "cp", "pp"):
        if getattr(m, field) < 1:
            raise ConfigError(f"{key}.{field} must be >= 1, got {getattr(m, field)}")
    if m.offset < 0 or m.size < 0:
        raise ConfigError(f"{key}.offset and .size must be >= 0, got offset={m.offset} size={m.size}")
    size = m.size or world_size
    model = m.tp * m.cp * m.pp
    if size % model:
        raise ConfigError(f"{key}: size {size} is not divisible by tp*cp*pp = {model} (tp={m.tp}, cp={m.cp}, "
                         f"pp={m.pp}); pick degrees whose product divides the size, dp takes the rest")
    return Grid(offset=m.offset, tp=m.tp, cp=m.cp, dp=size // model, pp=m.pp)


def check_heads_divisible(name: str, heads: int, kv_heads: int, tp: int) -> None:
    """Tensor parallel splits attention by heads, so both head counts must divide by tp."""
    for field, n in (("heads", heads), ("kv_heads", kv_heads)):
        if n % tp:
            ok = [d for d in range(1, min(heads, kv_heads) + 1) if heads % d == 0 and kv_heads % d == 0]
            raise ConfigError(f"module '{name}': {field} ({n}) is not divisible by tp ({tp}); "
                             f"set parallel.modules.{name}.tp to one of {ok}")
