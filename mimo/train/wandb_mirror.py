"""Weights & Biases as a third sink for the run's metrics (`metrics.wandb`), beside metrics.jsonl and TensorBoard.

Why a file of its own: W&B is an optional dependency; everything that touches it lives here, so the rest of
the trainer never imports it. A run resumed from a checkpoint continues the same W&B run (its id is kept
in the run folder); a run that starts at step 0 starts a new one, even in an old run folder.
W&B's own environment variables apply (WANDB_MODE=offline, WANDB_ENTITY, WANDB_API_KEY, ...).
"""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path

from mimo.config.schema import ConfigError

ID_FILE = "wandb_run_id"
"""File in the run folder that holds the W&B run id, so that a resumed run logs into the same W&B run."""


def require_wandb() -> None:
    """Raise a ConfigError naming `metrics.wandb` when the wandb package is missing (call on every rank)."""
    try:
        importlib.import_module("wandb")
    except ImportError as e:
        raise ConfigError("metrics.wandb = true needs the wandb package: pip install wandb (pip install -e "
                          "'.[wandb]' in the mimo checkout) "
                          "(or set metrics.wandb = false)") from e


class WandbMirror:
    """One W&B run per mimo run folder, fed the flat scalars MetricsLogger makes (`train/...` per logged step,
    `summary/...` once)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: dict, resumed: bool):
        import wandb

        id_file = run_dir / ID_FILE
        run_id = id_file.read_text().strip() if resumed and id_file.is_file() else uuid.uuid4().hex[:12]
        self.run = wandb.init(project=project, name=name, id=run_id, resume="allow", dir=str(run_dir),
                              config=config)
        id_file.write_text(run_id + "\n")

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def summary(self, values: dict[str, float]) -> None:
        self.run.summary.update(values)

    def close(self) -> None:
        self.run.finish()
