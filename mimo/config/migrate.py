"""The one table of config keys that moved, and the refusal of a TOML file or override that still uses one.

A moved key is never read under its old name: the run stops at load with the key's new name, so no config
silently changes meaning.
"""

from __future__ import annotations

from typing import Any

from mimo.config.schema import ConfigError

_TO_PRECISION = ("dtype", "module_dtype", "float8_recipe", "master_weights")
_TO_PERF = ("gpu_defaults", "compile", "compile_backend", "encoder_compile", "chunked_loss", "fuse_qkv",
            "activation_checkpointing", "loss_rows_only", "attention_backend", "grad_table", "lm_update_early",
            "step_graph")

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


def refuse_moved_keys(data: dict[str, Any], source: str) -> None:
    """Raise a ConfigError naming the new key when the raw config tree `data` (read from `source`: a TOML file
    or the command line) sets a key that moved."""
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            raise ConfigError(f"{old} moved to {new}; rename it in {source}")


def rename_moved_keys(data: dict[str, Any]) -> dict[str, Any]:
    """The raw config tree `data` with each moved key under its new name: a run folder's config.toml written by
    an older mimo, whose keys keep their meaning (a user's TOML is refused instead, `refuse_moved_keys`)."""
    out = {name: dict(table) if isinstance(table, dict) else table for name, table in data.items()}
    for old, new in MOVED_KEYS.items():
        (section, key), (new_section, new_key) = old.split("."), new.split(".")
        if isinstance(out.get(section), dict) and key in out[section]:
            out.setdefault(new_section, {})[new_key] = out[section].pop(key)
    return out
