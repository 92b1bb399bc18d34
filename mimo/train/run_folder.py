"""Who may write a run folder: one live run at a time, and never over another run's outputs.

A run takes the folder's lock (an exclusive `flock` on the folder itself, held by rank 0 while it trains
and released by the kernel when the process dies, so a crashed run leaves no stale lock). A folder that
already holds a run's outputs is refused, before anything in it is written, unless this run continues it
(`checkpoint.resume`) or the config says `run.overwrite = true`:
- resume = false: the folder must hold no run; with overwrite the old outputs are deleted first;
- resume = true: the newest loadable checkpoint is continued; if none loads, the run would start over,
  which again needs an empty folder or overwrite;
- resume = <path>: a checkpoint of this folder is continued, but one with later checkpoints beside it
  (a rewind, which would replace them) needs overwrite; a checkpoint of another folder needs this one
  empty or overwrite.
Every decision is taken by rank 0 and agreed by all ranks (parallel/verdict.py), so all raise together.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import tomllib

from mimo.config.load import SAVED_RUN_DEFAULTS
from mimo.config.schema import Config, ConfigError
from mimo.parallel.verdict import first_problem
from mimo.train.checkpoint.store import CheckpointStore, folder_step

OUTPUTS = ("config.toml", "metrics.jsonl", "summary.json", "loss.png", "checkpoint", "checkpoints", "tensorboard",
           "wandb", "wandb_run_id")
"""What a run writes into its folder; `run.overwrite` deletes these and nothing else."""


class RunFolder:
    """The claim of one run on `path`; `rank` 0 holds the lock and inspects the folder."""

    def __init__(self, cfg: Config, path: Path, rank: int):
        self.cfg, self.path, self.rank = cfg, Path(path), rank
        self._fd: int | None = None
        self._if_fresh = ""

    def outputs(self) -> list[str]:
        """The run outputs already in the folder."""
        return [n for n in OUTPUTS if (self.path / n).exists()]

    @contextmanager
    def claim(self) -> Iterator[RunFolder]:
        """Collective: lock the folder and refuse it (ConfigError on every rank) when this run may not write it;
        the lock is released on exit."""
        try:
            _, problem = first_problem(self._lock() if self.rank == 0 else "")
            if not problem:
                _, problem = first_problem(self._refusal_now() if self.rank == 0 else "")
            if problem:
                raise ConfigError(problem)
            _, self._if_fresh = first_problem(self._refusal_if_fresh() if self.rank == 0 else "")
            yield self
        finally:
            self.release()

    def start_over(self) -> None:
        """Collective-free, the same on every rank: the run starts at step 0 here. Raises ConfigError when the
        folder holds another run and run.overwrite is false; with overwrite, rank 0 deletes the old outputs."""
        if self._if_fresh:
            raise ConfigError(self._if_fresh)
        if self.rank == 0 and self.cfg.run.overwrite:
            for name in self.outputs():
                target = self.path / name
                shutil.rmtree(target) if target.is_dir() else target.unlink()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # Rank 0's inspection ------------------------------------------------------------------------------------
    def _lock(self) -> str:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return (f"run folder '{self.path}' is in use by another running `mimo train` (it holds the folder's "
                    "lock); wait for it to finish, or choose another --run.name")
        except OSError as e:  # a file system without flock (some network mounts): run unlocked, and say so
            os.close(fd)
            print(f"mimo: warning: cannot lock run folder '{self.path}' ({e}); make sure no other run uses it",
                  file=sys.stderr, flush=True)
            return ""
        self._fd = fd
        return ""

    def _held(self) -> str:
        return f"run folder '{self.path}' holds another run ({', '.join(self.outputs())})"

    def _refusal_now(self) -> str:
        """Why this run may not use the folder at all, or ""."""
        resume, overwrite = self.cfg.checkpoint.resume, self.cfg.run.overwrite
        if overwrite or not self.outputs():
            return ""
        if resume is False or resume == "never":
            return (f"{self._held()}; continue it with --checkpoint.resume=true, choose another --run.name, or set "
                    "--run.overwrite=true to delete its outputs and start over")
        if resume is True or resume == "auto":
            return self._format_change()
        named = Path(str(resume)).resolve()
        own = (self.path / "checkpoints").resolve()
        if named.parent != own:
            return (f"{self._held()}, and checkpoint.resume = '{resume}' is a checkpoint of another folder; resume "
                    "into a new --run.name, or set --run.overwrite=true to replace this folder's run")
        good, _ = CheckpointStore(own, self.cfg.checkpoint.keep).scan()
        later = [f.path.name for f in good if f.step > folder_step(named.name)]
        if later:
            return (f"checkpoint.resume = '{resume}' rewinds the run in '{self.path}', whose later checkpoints {later} "
                    "its saves would replace; set --run.overwrite=true to allow that, or resume into a new "
                    "--run.name")
        return self._format_change()

    def _format_change(self) -> str:
        """Why continuing the run in this folder would change what its samples mean (its saved config.toml has
        another `data.prompt_format`; one written before the key existed reads as SAVED_RUN_DEFAULTS'), or ""."""
        saved = self.path / "config.toml"
        if not saved.is_file():
            return ""
        with saved.open("rb") as f:
            data = tomllib.load(f).get("data", {})
        was, now = data.get("prompt_format", SAVED_RUN_DEFAULTS["data"]["prompt_format"]), self.cfg.data.prompt_format
        if was == now:
            return ""
        return (f"the run in '{self.path}' was trained with data.prompt_format = \"{was}\"; continuing it with "
                f"\"{now}\" would change how its chats are laid out mid-run. Set --data.prompt_format={was} to "
                "continue it, or train a new --run.name in the new format")

    def _refusal_if_fresh(self) -> str:
        """Why this run may not start at step 0 here (resume = true found nothing to load), or ""."""
        if self.cfg.run.overwrite or not self.outputs():
            return ""
        return (f"{self._held()} and no checkpoint to continue it from (it stopped before its first save, or every "
                "checkpoint was damaged); nothing in it was changed. Set --run.overwrite=true to delete its outputs "
                "and start over, or choose another --run.name")
