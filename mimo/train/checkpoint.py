"""Model weights in and out of a run folder as safetensors (no pickled code is ever loaded)."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_model, save_model
from torch import nn

from mimo.config import Config, load_config
from mimo.mimo_model import MimoModel, build_model

WEIGHTS = "model.safetensors"


def save_weights(model: nn.Module, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (WEIGHTS + ".tmp")
    save_model(model, str(tmp))
    final = directory / WEIGHTS
    tmp.replace(final)
    return final


def load_run(run_dir: str | Path) -> tuple[Config, MimoModel]:
    """Rebuild the model of a finished run from its saved config and final weights."""
    run = Path(run_dir)
    cfg_path = run / "config.toml"
    weights = run / "checkpoint" / WEIGHTS
    for p in (cfg_path, weights):
        if not p.is_file():
            raise FileNotFoundError(f"'{p}' is missing; --run must name a folder written by `mimo train`")
    cfg = load_config(cfg_path)
    model = build_model(cfg.model)
    load_model(model, str(weights))
    model.eval()
    return cfg, model
