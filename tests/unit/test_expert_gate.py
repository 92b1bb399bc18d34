"""The gate refuses expert layouts it cannot run, naming the field."""

import pytest

from mimo.config.schema import ConfigError
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from tests.support.expert_case import moe_config


@pytest.mark.parametrize(("lm", "world", "message"), [
    (dict(ep=3), 4, r"parallel.modules.language.ep = 3 must divide the LM's dp \(4"),
    (dict(ep=4, tp=2), 4, r"ep = 4 must divide the LM's dp \(2; experts are carved out of data parallelism"),
    (dict(ep=8), 8, r"ep = 8 must divide model.llm.moe_experts \(4\)"),
    (dict(ep=0), 4, r"parallel.modules.language.ep = 0 must be >= 1"),
])
def test_gate_refuses_expert_layouts_it_cannot_run(lm, world, message):
    cfg = moe_config(lm, "softmax", 1)
    with pytest.raises(ConfigError, match=message):
        validate_plan(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world))


def test_gate_refuses_ep_without_experts_or_off_the_language_model():
    cfg = moe_config(dict(ep=2), "softmax", 1)
    cfg.model.llm.moe_experts = 0
    with pytest.raises(ConfigError, match="ep = 2 needs an MoE language model; set model.llm.moe_experts"):
        validate_plan(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 4))
    cfg = moe_config(dict(), "softmax", 1)
    cfg.parallel.modules["images"].ep = 2
    with pytest.raises(ConfigError, match="parallel.modules.images.ep = 2: expert parallelism applies to the lang"):
        validate_plan(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 4))
