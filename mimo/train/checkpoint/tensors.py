"""A run's weights read out of its sharded DCP checkpoint one full tensor at a time, on one process.

`resolve_checkpoint` turns what a user passes (a run folder, or any of its `checkpoints/step_*` folders,
of a finished run or not) into the run folder (its config.toml) and the checkpoint folder. `CheckpointTensors`
then reads each weight whole, assembled from every rank's shards by DCP, so `mimo export` can stream a model
that no process ever held at once: its peak is one tensor. Nothing here communicates.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from mimo.config.schema import LANGUAGE
from mimo.train.checkpoint.safe_dcp import SafeFileSystemReader, read_metadata_file
from mimo.train.checkpoint.store import CheckpointStore, folder_step

MODEL_PREFIX = "model."


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) of `path`: a `checkpoints/step_*` folder (complete or not, as long as
    its DCP index is readable), or a run folder, whose newest complete checkpoint is taken."""
    p = Path(path)
    if (p / ".metadata").is_file() and folder_step(p.name) >= 0:
        run = p.parent.parent
    else:
        run = p
        good, bad = CheckpointStore(p / "checkpoints", 1).scan()
        if not good:
            why = f"; {bad[0].path.name}: {bad[0].problem}" if bad else ""
            raise FileNotFoundError(f"'{p}' holds no complete checkpoints/step_* folder{why}; pass a folder written "
                                    "by `mimo train` or one of its checkpoints/step_* folders")
        p = good[0].path
    if not (run / "config.toml").is_file():
        raise FileNotFoundError(f"'{run / 'config.toml'}' is missing; the checkpoint '{p}' must sit in "
                                "<run>/checkpoints/ of a folder written by `mimo train`")
    return run, p


def dcp_key(name: str) -> str:
    """The checkpoint's key of a MimoModel state-dict name: model.language.* / model.<modality>.*."""
    if name.startswith("language_model."):
        return f"{MODEL_PREFIX}{LANGUAGE}.{name.removeprefix('language_model.')}"
    _, modality, rest = name.split(".", 2)
    return f"{MODEL_PREFIX}{modality}.{rest}"


class CheckpointTensors:
    """The weights of one checkpoint folder by MimoModel name, each read whole on demand."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.saved = read_metadata_file(self.directory / ".metadata").state_dict_metadata

    def has(self, name: str) -> bool:
        return dcp_key(name) in self.saved

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        md = self.saved[dcp_key(name)]
        return tuple(md.size), md.properties.dtype

    def read(self, name: str) -> torch.Tensor:
        """The full tensor `name` on the CPU (raises KeyError naming the checkpoint when it is not there)."""
        key = dcp_key(name)
        if key not in self.saved:
            raise KeyError(f"checkpoint '{self.directory}' has no '{key}'; it was written for another model config")
        shape, dtype = self.shape_dtype(name)
        out = torch.empty(shape, dtype=dtype)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load({key: out}, storage_reader=SafeFileSystemReader(str(self.directory)), no_dist=True)
        return out
