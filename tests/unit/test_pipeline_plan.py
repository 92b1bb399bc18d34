"""Pipeline schedule arithmetic and the gate's pipeline refusals, in one process."""

import pytest

from mimo.config.schema import ConfigError, ModuleLayoutConfig
from mimo.config.validate import validate
from mimo.parallel.bridge.colocated_pipelined import ColocatedPipelineBridge
from mimo.parallel.bridge.pipelined import lane_overlaps
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from mimo.parallel.pipeline.schedule import warmup_microbatches
from mimo.parallel.pipeline.split import stage_layers
from tests.support.pipeline_case import pipeline_config, pipeline_module


def test_schedule_and_split_arithmetic():
    assert [warmup_microbatches(4, s, 4) for s in range(4)] == [3, 2, 1, 0]
    assert warmup_microbatches(6, 0, 4) == 4
    assert [stage_layers(3, 2, r) for r in range(2)] == [["0"], ["1", "2"]]
    with pytest.raises(ValueError, match="3 layers cannot fill 4"):
        stage_layers(3, 4, 0)
    # encoder lane, LM lane, samples [lo, hi) of the microbatch
    assert lane_overlaps(4, 1, 4) == [(0, 0, 0, 1), (1, 0, 1, 2), (2, 0, 2, 3), (3, 0, 3, 4)]
    assert lane_overlaps(1, 2, 4) == [(0, 0, 0, 2), (0, 1, 2, 4)]
    assert lane_overlaps(2, 3, 6) == [(0, 0, 0, 2), (0, 1, 2, 3), (1, 1, 3, 4), (1, 2, 4, 6)]


@pytest.mark.parametrize("change,message", [
    (lambda c: c.parallel.modules.update(language=pipeline_module(2, 1, 6, 1)),
     r"parallel.modules.language.pp \(6\) exceeds model.llm.layers \(3\)"),
    (lambda c: setattr(c.parallel.modules["images"], "fsdp", True),
     r"parallel.modules.images.fsdp: a pipelined encoder \(pp = 2\) cannot be sharded"),
    (lambda c: setattr(c.parallel.modules["language"], "fsdp", True),
     r"parallel.modules.language.fsdp: sharding a pipelined LM is available with tp = cp = ep = 1 only \(got tp 2"),
    (lambda c: setattr(c.parallel.modules["images"], "sequence_parallel", True),
     "a pipelined encoder cannot be sequence parallel"),
])
def test_bad_pipeline_configs_are_rejected_before_any_collective(change, message):
    cfg = pipeline_config((1, 2, 1), (2, 3, 1), False)
    change(cfg)
    layout = Layout.from_config(cfg.parallel.modules, ["language", "images"], 8)
    with pytest.raises(ConfigError, match=message):
        validate_plan(cfg, layout)


def test_a_sharded_encoder_on_its_own_ranks_passes_the_gate():
    """fsdp = true on an unsplit encoder (pp = 1, dp 2) on its own ranks; its parity run is in test_mixed_images."""
    cfg = pipeline_config((1, 1, 2), (1, 2, 1), False)
    cfg.parallel.modules["images"].fsdp = True
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, ["language", "images"], 4))


def test_an_encoder_on_the_lms_ranks_is_not_pipelined():
    cfg = pipeline_config((1, 1, 1), (1, 1, 1), False)
    for lm_pp in (1, 2):
        cfg.parallel.modules = {"images": ModuleLayoutConfig(pp=2), "language": ModuleLayoutConfig(pp=lm_pp)}
        layout = Layout.from_config(cfg.parallel.modules, ["language", "images"], 2)
        with pytest.raises(ConfigError, match="images.pp = 2: an encoder on the LM's ranks runs whole on every rank"):
            validate_plan(cfg, layout)


def test_a_colocated_pipeline_passes_the_gate_and_refuses_a_sharded_out_path():
    """Images dp4 beside LM pp2 x dp2 pass, with the Out path too; sharding the Out path's modality is refused."""
    cfg = pipeline_config((1, 1, 1), (1, 1, 1), False)
    cfg.parallel.modules = {"images": ModuleLayoutConfig(fsdp=True), "language": ModuleLayoutConfig(pp=2)}
    names = ["language", "images"]
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, names, 4))
    cfg.model.modalities["images"].output_token_id = 61
    with pytest.raises(ConfigError, match=r"parallel.modules.images.fsdp: 'images' has an Out path"):
        validate_plan(cfg, Layout.from_config(cfg.parallel.modules, names, 4))
    cfg.parallel.modules["images"].fsdp = False
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, names, 4))


def test_encoder_offload_is_refused_where_it_frees_nothing():
    """perf.encoder_offload: a modality's, on a GPU, beside a pipelined LM on the encoders' ranks only."""
    cfg = pipeline_config((1, 1, 1), (1, 1, 1), False)
    cfg.perf.encoder_offload = ["images"]
    names, beside = ["language", "images"], r"perf.encoder_offload = \['images'\] frees encoder memory during the LM"
    for modules in ({"images": ModuleLayoutConfig(), "language": ModuleLayoutConfig()},
                    {"images": pipeline_module(0, 1, 1, 2), "language": pipeline_module(2, 1, 2, 1)}):
        with pytest.raises(ConfigError, match=beside):
            validate_plan(cfg, Layout.from_config(modules, names, 4))
    cfg.parallel.modules = {"images": ModuleLayoutConfig(), "language": ModuleLayoutConfig(pp=2)}
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, names, 4))
    with pytest.raises(ConfigError, match=r"perf.encoder_offload = \['images'\] moves weights from a GPU to host "
                                          r'memory \(train.device = "cuda", got "cpu"\)'):
        validate(cfg)
    cfg.train.device = "cuda"
    validate(cfg)
    cfg.perf.encoder_offload = ["language"]
    with pytest.raises(ConfigError, match="perf.encoder_offload names 'language', which is no modality"):
        validate(cfg)


def test_colocated_pipeline_bridge_routes_rows_by_sample():
    """Images dp4 beside LM pp2 x dp2 (4 ranks), one microbatch of 4 samples holding 0, 3, 1 and 2 rows: encoder
    lane i owes LM lane j the rows of the samples both cover; ranks 0-1 take LM lanes 0-1 on the first stage."""
    bridge = ColocatedPipelineBridge("images", Grid(dp=4), Grid(dp=2, pp=2), rank=1, hidden=8)
    bridge.begin([[0, 3, 1, 2]])
    assert [bridge._span(0, 4, i) for i in range(4)] == [(0, 0), (0, 3), (3, 4), (4, 6)]
    assert [bridge._span(0, 2, j) for j in range(2)] == [(0, 3), (3, 6)]
    assert [[bridge._sizes(i, j) for j in range(2)] for i in range(4)] == [[[0], [0]], [[3], [0]], [[0], [1]],
                                                                          [[0], [2]]]
    assert bridge.first == [True, True, False, False] and bridge.lead == [True, True, False, False]
