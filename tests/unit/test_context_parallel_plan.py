"""Context parallelism's zigzag split and the plan's refusals, in one process."""

import pytest

from mimo.config.schema import ConfigError
from mimo.parallel.context import check_divisible, gathered_order, zigzag_index
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from tests.support.cp_case import cp_config


def test_zigzag_split_and_gathered_key_order():
    assert zigzag_index(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert zigzag_index(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert zigzag_index(8, 4, 3).tolist() == [3, 4]
    assert sorted(gathered_order(24, 3).tolist()) == list(range(24))
    with pytest.raises(ValueError, match=r"divisible by 2 x cp = 2 x 2 = 4 .*data.pack_length"):
        check_divisible(18, 2)


def test_plan_rejects_unsupported_context_parallel_configs():
    cfg = cp_config(dict(cp=2), 1, 1)
    cfg.parallel.modules["images"].cp = 2
    with pytest.raises(ConfigError, match="context parallelism applies to the LM only"):
        validate_plan(cfg, Layout.from_config(cfg.parallel.modules, ["language", "images"], 8))
    cfg = cp_config(dict(cp=2, tp=2, sequence_parallel=True), 2, 1)
    cfg.data.packing, cfg.data.pack_length = True, 36
    with pytest.raises(ConfigError, match=r"data.pack_length \(36\) must be a multiple of 8"):
        validate_plan(cfg, Layout.from_config(cfg.parallel.modules, ["language", "images"], 8))
    # The Out path beside CP is no longer refused: it gathers the sequence whole (test_colocated_layouts.py).
    cfg = cp_config(dict(cp=2), 1, 1)
    cfg.model.modalities["images"].output_token_id = 61
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, ["language", "images"], 8))
