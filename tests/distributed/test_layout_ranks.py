"""A layout too wide for the world fails on every rank, before any group is built."""

import pytest

from mimo.config.schema import ModuleLayoutConfig as M
from mimo.parallel.layout import Layout
from tests.support.dist import run_distributed


def _validate_bad_layout(rank: int, world_size: int) -> str:
    """Every rank validates before building groups; a hang here would mean a rank skipped the check."""
    try:
        modules = {"vision": M(size=1), "language": M(offset=1, size=2)}
        layout = Layout.from_config(modules, ["vision", "language"], world_size)
    except ValueError as e:
        return str(e)
    layout.grids["language"].build()
    return "no error"


@pytest.mark.slow
def test_bad_layout_fails_on_every_rank():
    out = run_distributed(_validate_bad_layout, 2, timeout=30.0)
    assert out[0] == out[1] == "grid of 'language' spans ranks 1..2 but the world has 2 ranks; shrink its " \
                               "offset/size or launch more processes"
