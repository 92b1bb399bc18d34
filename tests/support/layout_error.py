"""The gate's message for a layout of the tiny demo run that it refuses."""

from __future__ import annotations

import pytest

from mimo.config.load import load_config
from mimo.config.schema import ConfigError
from mimo.parallel.layout import Layout
from mimo.train.gate import check_layout
from tests.support.tiny_run import DEMO, TINY


def layout_error(world: int, *overrides: str) -> str:
    cfg = load_config(DEMO, [*TINY, *overrides])
    with pytest.raises(ConfigError) as err:
        check_layout(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world))
    return str(err.value)
