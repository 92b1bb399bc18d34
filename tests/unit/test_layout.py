"""Layout validation messages, roles and the config constructor."""

import re

import pytest

from mimo.config.schema import ModuleLayoutConfig as M
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout, Role, StageInfo, check_heads_divisible

NAMES = ["vision", "language"]


def test_colocated_roles():
    layout = Layout({"vision": Grid(dp=8), "language": Grid(tp=2, dp=2, pp=2)}, 8)
    assert layout.colocated
    assert layout.role(1) == Role(1, {"vision": StageInfo(True, True), "language": StageInfo(True, False)})
    role = layout.role(6)
    assert role.modules == ("vision", "language") and role.stages["language"] == StageInfo(False, True)


def test_non_colocated_roles():
    layout = Layout({"vision": Grid(dp=2), "language": Grid(offset=2, tp=2, pp=3)}, 8)
    assert not layout.colocated
    assert layout.role(0) == Role(0, {"vision": StageInfo(True, True)})
    assert layout.role(3).stages == {"language": StageInfo(True, False)}
    assert layout.role(5).stages == {"language": StageInfo(False, False)}
    assert layout.role(7).holds("language") and not layout.role(7).holds("vision")
    assert layout.role(7).stages["language"].last


def test_role_of_rank_outside_world():
    with pytest.raises(RuntimeError, match="rank 8 is in no module's grid"):
        Layout({"language": Grid(dp=8)}, 8).role(8)


BAD_LAYOUTS = [
    ({"vision": Grid(dp=4), "language": Grid(offset=4, dp=8)}, 8,
     "grid of 'language' spans ranks 4..11 but the world has 8 ranks"),
    ({"vision": Grid(dp=4), "language": Grid(offset=2, dp=6)}, 8,
     "grids of 'vision' (ranks 0..3) and 'language' (ranks 2..7) partially overlap; grids must span "
     "identical ranks (colocated) or be pairwise disjoint"),
    ({"a": Grid(dp=4), "b": Grid(tp=4), "language": Grid(offset=4, dp=4)}, 8,
     "some grids share ranks and others do not ('a' on ranks 0..3, 'b' on ranks 0..3, 'language' on "
     "ranks 4..7)"),
    ({"vision": Grid(dp=2), "language": Grid(offset=3, dp=5)}, 8, "no module's grid covers rank 2 (a gap)"),
    ({"vision": Grid(dp=4), "language": Grid(tp=4)}, 8,
     "the grids cover ranks 0..3 but the world has 8 ranks; launch 4 processes"),
    ({"language": Grid(offset=2, dp=6)}, 8, "no module's grid covers ranks 0..1 (a gap)"),
    ({}, 8, "the layout has no modules"),
    ({"language": Grid()}, 0, "world size must be >= 1, got 0"),
]


@pytest.mark.parametrize("grids,world,message", BAD_LAYOUTS)
def test_bad_layouts(grids: dict[str, Grid], world: int, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        Layout(grids, world)


def test_from_config_defaults_to_pure_dp():
    layout = Layout.from_config({}, NAMES, 4)
    assert layout.grids == {"vision": Grid(dp=4), "language": Grid(dp=4)}
    layout = Layout.from_config({"language": M(tp=2)}, NAMES, 8)
    assert layout.grids == {"vision": Grid(dp=8), "language": Grid(tp=2, dp=4)}


def test_from_config_derives_dp_and_places_grids():
    modules = {"language": M(offset=2, size=6, tp=2, pp=3), "vision": M(size=2, tp=2)}
    layout = Layout.from_config(modules, NAMES, 8)
    assert list(layout.grids) == NAMES
    assert layout.grids == {"vision": Grid(tp=2), "language": Grid(offset=2, tp=2, pp=3)}
    assert Layout.from_config({"language": M(cp=2, pp=2)}, ["language"], 8).grids["language"].dp == 2


BAD_CONFIGS = [
    ({"language": M(tp=3)}, 8, "parallel.modules.language: size 8 is not divisible by tp*cp*pp = 3 "
                               "(tp=3, cp=1, pp=1)"),
    ({"language": M(size=2, tp=4)}, 8, "size 2 is not divisible by tp*cp*pp = 4"),
    ({"language": M(pp=0)}, 8, "parallel.modules.language.pp must be >= 1, got 0"),
    ({"language": M(offset=-1)}, 8, "parallel.modules.language.offset and .size must be >= 0"),
    ({"audio": M()}, 8, "parallel.modules.audio names no module; modules are: vision, language"),
    ({"language": M(offset=4, size=4)}, 8,
     "grids of 'vision' (ranks 0..7) and 'language' (ranks 4..7) partially overlap; grids must span "
     "identical ranks (colocated) or be pairwise disjoint (non-colocated); set parallel.modules.<name>."
     "offset/size accordingly (note: vision had no parallel.modules entry and defaulted to all ranks"),
]


@pytest.mark.parametrize("modules,world,message", BAD_CONFIGS)
def test_bad_configs(modules: dict[str, M], world: int, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        Layout.from_config(modules, NAMES, world)


def test_check_heads_divisible():
    check_heads_divisible("language", 8, 4, 4)
    with pytest.raises(ValueError, match=re.escape("module 'language': heads (6) is not divisible by tp (4); "
                                                   "set parallel.modules.language.tp to one of [1, 2]")):
        check_heads_divisible("language", 6, 2, 4)
    with pytest.raises(ValueError, match=re.escape("kv_heads (2) is not divisible by tp (4)")):
        check_heads_divisible("language", 8, 2, 4)
