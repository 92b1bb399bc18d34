"""GPU defaults turn master weights on under expert parallelism."""

from __future__ import annotations

from mimo.parallel.layout import Layout
from mimo.perf.gpu_defaults import resolve_gpu_defaults
from tests.support.master_weights import EP_FSDP, LANG, MODEL, MOE
from tests.support.tiny_run import tiny_config


def test_gpu_defaults_turn_master_weights_on_under_expert_parallel(tmp_path):
    for layout in ([f"{LANG}.ep=2"], EP_FSDP):
        cfg = tiny_config(tmp_path, *MODEL, *MOE, *layout, "--train.device=cuda")
        run, notes = resolve_gpu_defaults(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, 2))
        assert run.precision.master_weights is True, (layout, notes)
