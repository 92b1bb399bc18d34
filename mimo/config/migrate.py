"""The tables of config keys that moved or were retired, and the refusal of a TOML file or override that still
uses one.

A moved key is never read under its old name: the run stops at load with the key's new name, so no config
silently changes meaning. A retired key (a fast path removed, BENCHMARKS.md's "Tried and dropped") is refused
the same way, naming why; a run folder's saved config.toml loads without it, since it changed no result.
"""

from __future__ import annotations

from typing import Any

from mimo.config.schema import ConfigError

_TO_PRECISION = ("dtype", "module_dtype", "float8_recipe", "master_weights")
_TO_PERF = ("gpu_defaults", "compile", "compile_backend", "encoder_compile", "chunked_loss", "fuse_qkv",
            "activation_checkpointing", "loss_rows_only", "attention_backend", "grad_table")

MOVED_KEYS: dict[str, str] = {
    **{f"train.{k}": f"precision.{k}" for k in _TO_PRECISION},
    **{f"train.{k}": f"perf.{k}" for k in _TO_PERF},
    "train.save_every": "checkpoint.save_every",
    "train.keep_checkpoints": "checkpoint.keep",
    "train.resume": "checkpoint.resume",
    "train.peak_tflops": "metrics.peak_tflops",
    "train.throughput_warmup": "metrics.throughput_warmup",
    **{f"run.{k}": f"metrics.{k}" for k in ("tensorboard", "progress", "wandb", "wandb_project")},
}
"""Old dotted key -> its new dotted key (issue 44 split `[train]` into precision, perf, checkpoint, metrics)."""

_STEP_GRAPH = ("the step captured as one CUDA graph, +0.86% tokens/s on `small` on one process and refused on every "
               "larger layout; every step now runs one path")
_LM_UPDATE_EARLY = ("the language model's update started on a side stream under the encoders' backward, +0.35 to "
                    "0.5% tokens/s on `small` on one process and refused on every larger layout; every step now "
                    "updates after its backward")
RETIRED_KEYS: dict[str, str] = {"perf.step_graph": _STEP_GRAPH, "train.step_graph": _STEP_GRAPH,
                                "perf.lm_update_early": _LM_UPDATE_EARLY, "train.lm_update_early": _LM_UPDATE_EARLY}
"""Retired dotted key -> what it did and why it went (issue 41: one step path on every layout)."""


def old_key_error(key: str) -> str | None:
    """Why the dotted `key` is no longer read (it moved or was retired), or None for any other key."""
    if key in MOVED_KEYS:
        return f"{key} moved to {MOVED_KEYS[key]}"
    if key in RETIRED_KEYS:
        return f"{key} was retired ({RETIRED_KEYS[key]}, BENCHMARKS.md)"
    return None


def refuse_old_keys(data: dict[str, Any], source: str) -> None:
    """Raise a ConfigError naming the new key, or why the key went, when the raw config tree `data` (read from
    `source`: a TOML file or the command line) sets a key that moved or was retired."""
    for name in (*MOVED_KEYS, *RETIRED_KEYS):
        section, key = name.split(".")
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            fix = "rename it" if name in MOVED_KEYS else "remove it"
            raise ConfigError(f"{old_key_error(name)}; {fix} in {source}")


def upgrade_saved_keys(data: dict[str, Any]) -> dict[str, Any]:
    """The raw config tree `data` with each moved key under its new name and each retired key dropped: a run
    folder's config.toml written by an older mimo, whose keys keep their meaning (a user's TOML is refused
    instead, `refuse_old_keys`)."""
    out = {name: dict(table) if isinstance(table, dict) else table for name, table in data.items()}
    for old, new in MOVED_KEYS.items():
        (section, key), (new_section, new_key) = old.split("."), new.split(".")
        if isinstance(out.get(section), dict) and key in out[section]:
            out.setdefault(new_section, {})[new_key] = out[section].pop(key)
    for name in RETIRED_KEYS:
        section, key = name.split(".")
        if isinstance(out.get(section), dict):
            out[section].pop(key, None)
    return out
