"""The defaults of `mimo train` on a GPU: the fastest measured settings (BENCHMARKS.md) that a layout accepts.

A key the user left unset (`TrainConfig.left_unset`: neither the TOML file nor the command line names it)
takes, on `train.device = "cuda"` with `train.gpu_defaults = true` (the default), the value of GPU_DEFAULTS,
one key at a time in that order, each kept only if the config and the layout accept it with the keys before
it (`validate_fast_path_keys`, `check_lm_features`, `check_fast_path_layout`); otherwise it keeps its CPU
default. A key the user set is never changed, and on a
CPU nothing is. Not collective: every rank reaches the same values from the same config and world size.

Left out, opt-in only: `lm_update_early` and `step_graph` (they need `optim.clip = 0`, stop the run on a
non-finite step instead of skipping it, and a captured step needs every batch of one shape).
"""

from __future__ import annotations

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.config.validate import validate_fast_path_keys
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import check_lm_features
from mimo.perf.apply import check_fast_path_layout

GPU_DEFAULTS: tuple[tuple[str, object], ...] = (
    ("dtype", "bfloat16"),
    ("master_weights", True),
    ("grad_table", True),
    ("compile", True),
    ("encoder_compile", "whole"),
    ("chunked_loss", True),
    ("fuse_qkv", True),
    ("loss_rows_only", True),
    ("attention_backend", "cudnn"),
)
"""(train key, value on a GPU), in the order they are tried: the benchmark presets' settings
(benchmarks/presets/*.toml) less the two opt-in keys above."""


def apply_gpu_defaults(cfg: Config, layout: Layout | None) -> dict[str, object]:
    """Set each unset key of GPU_DEFAULTS on `cfg.train` in place where `cfg` and `layout` (None: one process)
    accept it; returns {key: value} of those set (empty off CUDA)."""
    t = cfg.train
    if not (t.device.startswith("cuda") and t.gpu_defaults):
        return {}
    applied: dict[str, object] = {}
    for i, (key, value) in enumerate(GPU_DEFAULTS):
        before = getattr(t, key)
        if key not in t.left_unset or before == value:
            continue
        setattr(t, key, value)
        if accepts(cfg, layout, frozenset(k for k, _ in GPU_DEFAULTS[i + 1:]) & t.left_unset):
            applied[key] = value
        else:
            setattr(t, key, before)
    return applied


def accepts(cfg: Config, layout: Layout | None, pending: frozenset[str] = frozenset()) -> bool:
    """Whether the fast-path keys of `cfg` (its model resolved from any hf_path) pass the gate's checks on
    `layout`, the unset keys still to try (`pending`) aside (cuDNN attention needs every module in bf16)."""
    try:
        validate_fast_path_keys(cfg, pending)
        check_lm_features(cfg, layout.grids[LANGUAGE] if layout is not None else Grid())
        if layout is not None and layout.world_size > 1:
            check_fast_path_layout(cfg, layout)
    except ConfigError:
        return False
    return True
