"""The defaults of `mimo train` on a GPU, resolved in one visible step at start: the fastest measured settings
(BENCHMARKS.md) that a layout accepts.

`resolve_gpu_defaults` gives a key the user left unset (`Config.left_unset`: neither the TOML file nor the
command line names it), on `train.device = "cuda"` with `perf.gpu_defaults = true` (the default), the value of
GPU_DEFAULTS, one key at a time in that order, each kept only if the config and the layout accept it with the
keys before it (`validate_fast_path_keys`, `validate_data`, `check_lm_features`, `check_fast_path_layout`);
otherwise it keeps its CPU default. A key the user set is never changed, and on a CPU nothing is. It returns
the resolved config (the run's, written to runs/<name>/config.toml) and, for each key, its value and why, which
the run prints once. Not collective: every rank reaches the same values from the same config and world size.
"""

from __future__ import annotations

import copy

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.config.validate import validate_data, validate_fast_path_keys
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import check_lm_features, validate_context_parallel
from mimo.perf.apply import check_fast_path_layout

GPU_DEFAULTS: tuple[tuple[str, object, str], ...] = (
    ("precision.dtype", "bfloat16", "bf16 autocast runs the matmuls on tensor cores"),
    ("precision.master_weights", True, "bf16 weights with fp32 master copies and one fused update"),
    ("perf.grad_table", True, "the update reads each gradient where autograd left it"),
    ("perf.compile", True, "compiled blocks fuse their elementwise kernels"),
    ("perf.encoder_compile", "whole", "each encoder one graph: fewer kernel launches"),
    ("perf.chunked_loss", True, "the loss without full fp32 logits"),
    ("perf.fuse_qkv", True, "q, k and v from one matmul"),
    ("perf.loss_rows_only", True, "the head and the loss on the labelled rows only"),
    ("perf.attention_backend", "cudnn", "cuDNN's attention, the fastest measured"),
    ("data.packing", True, "samples packed into rows of data.pack_length (data.seq_len unless set): the same "
                           "samples in fewer rows, without their padding"),
)
"""(dotted key, value on a GPU, what it buys), in the order they are tried: the benchmark presets' settings
(benchmarks/presets/*.toml), then packing wherever the data and the layout accept it (not synthetic rows, not
MoE router losses)."""

FastPath = tuple[str, object, str]
"""(dotted key, its value in the run, why it has it)."""


def config_value(cfg: Config, key: str) -> object:
    """The value of dotted `key` ("perf.compile") in `cfg`."""
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def resolve_gpu_defaults(cfg: Config, layout: Layout | None) -> tuple[Config, list[FastPath]]:
    """`cfg` with each unset key of GPU_DEFAULTS set where `cfg` and `layout` (None: one process) accept it
    (a copy: `cfg` is left alone), and (key, value, why) of every key of GPU_DEFAULTS (none off CUDA or with
    perf.gpu_defaults = false, where the copy equals `cfg`)."""
    resolved = copy.copy(cfg)
    resolved.precision, resolved.perf, resolved.data = (copy.deepcopy(cfg.precision), copy.deepcopy(cfg.perf),
                                                        copy.deepcopy(cfg.data))
    if not (cfg.train.device.startswith("cuda") and cfg.perf.gpu_defaults):
        return resolved, []
    notes: list[FastPath] = []
    for i, (key, value, gain) in enumerate(GPU_DEFAULTS):
        before = config_value(resolved, key)
        if key not in cfg.left_unset:
            notes.append((key, before, "set in the config"))
            continue
        section, name = key.split(".")
        setattr(getattr(resolved, section), name, value)
        length = resolved.data.pack_length
        if key == "data.packing" and length < 1:
            resolved.data.pack_length = resolved.data.seq_len
        refusal = refusal_of(resolved, layout, frozenset(k for k, _, _ in GPU_DEFAULTS[i + 1:]) & cfg.left_unset)
        if refusal is None:
            notes.append((key, value, f"GPU default: {gain}"))
        else:
            setattr(getattr(resolved, section), name, before)
            resolved.data.pack_length = cfg.data.pack_length
            notes.append((key, before, f"GPU default {value!r} refused: {refusal}"))
    return resolved, notes


def refusal_of(cfg: Config, layout: Layout | None, pending: frozenset[str] = frozenset()) -> str | None:
    """Why the gate's checks refuse the fast-path keys of `cfg` (its model resolved from any hf_path) on
    `layout`, the unset keys still to try (`pending`) aside; None when they pass (cuDNN attention needs every
    module in bf16)."""
    try:
        validate_fast_path_keys(cfg, pending)
        validate_data(cfg)
        if layout is not None:
            validate_context_parallel(cfg, layout)
        check_lm_features(cfg, layout.grids[LANGUAGE] if layout is not None else Grid())
        if layout is not None and layout.world_size > 1:
            check_fast_path_layout(cfg, layout)
    except ConfigError as e:
        return str(e)
    return None


def fast_paths_note(notes: list[FastPath]) -> str:
    """The lines that tell the user, once at start, which fast paths the run takes and why ("" off CUDA)."""
    if not notes:
        return ""
    shown = [f"  {key} = {str(v).lower() if isinstance(v, bool) else repr(v)}  ({why})" for key, v, why in notes]
    return "\n".join(["mimo: fast paths on CUDA (perf.gpu_defaults; set a key to choose it yourself):", *shown])
