"""The validation gate: layouts that passed the old checks and failed at the first batch or at build are
refused by `check_layout`, with the field and the fix."""

from __future__ import annotations

import re

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


def test_layouts_that_failed_at_the_first_batch_are_refused_at_the_gate():
    """On main at 5979b0d these passed every check and died later on every rank: LM cp2 x tp4 + SP on the
    demo's 40-token rows at the first batch (in ContextParallel.shard_batch), a sequence-parallel ViT whose 5
    tokens tp 2 cannot split at build (in parallelize_vit), after the process groups were made."""
    lm = ["--parallel.modules.language.cp=2", "--parallel.modules.language.tp=4", "--model.llm.heads=4",
          "--model.llm.kv_heads=4", "--parallel.modules.language.sequence_parallel=true", "--data.global_batch=8",
          "--model.modalities.images.vit.patch=8"]
    assert "the LM's rows of 40 tokens (data.name = 'shapes') must divide by 16 (2 x cp x tp" in layout_error(8, *lm)
    assert "rows of 24 tokens (data.name = 'synthetic') must divide by 16" in layout_error(
        8, *lm, "--data.name=synthetic", "--data.seq_len=24")
    vit = ["--parallel.modules.images.tp=2", "--parallel.modules.images.sequence_parallel=true"]
    assert "module 'images': sequence parallel splits the ViT's 5 tokens" in layout_error(2, *vit)


@pytest.mark.parametrize("overrides, message", [
    (["--model.llm.hidden=24", "--model.llm.heads=3", "--model.llm.kv_heads=3"],
     r"'language': heads \(3\) is not divisible by tp"),
    (["--model.llm.heads=4", "--model.llm.kv_heads=1"], r"'language': kv_heads \(1\) is not divisible by tp"),
    (["--model.llm.vocab=273"], r"model.llm.vocab \(273\) must be divisible by the LM's tp \(2\)"),
    (["--model.llm.mlp=65"], r"model.llm.mlp \(65\) must be divisible by the LM's tp \(2\)"),
])
def test_tensor_parallel_sizes_are_checked_at_the_gate(overrides, message):
    """What parallelize_lm used to check again (now an assert there)."""
    assert re.search(message, layout_error(2, "--parallel.modules.language.tp=2", "--model.llm.kv_heads=2", *overrides))


@pytest.mark.parametrize("overrides, message", [
    (["--model.modalities.images.vit.heads=3", "--model.modalities.images.vit.hidden=24"],
     r"'images': heads \(3\) is not divisible by tp"),
    (["--model.modalities.images.vit.mlp=65"], r"model.modalities.images.vit.mlp \(65\) must be divisible by its tp"),
])
def test_vit_tensor_parallel_sizes_are_checked_at_the_gate(overrides, message):
    """What parallelize_vit used to check again (now an assert there)."""
    assert re.search(message, layout_error(2, "--parallel.modules.images.tp=2", *overrides))
