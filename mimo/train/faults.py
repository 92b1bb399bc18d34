"""Fault handling inside the step loop: non-finite steps, runs of them, and SIGTERM.

Every decision here is taken by all ranks together. One small all-reduce per step carries two flags,
"this rank saw a non-finite loss" and "this rank received SIGTERM", so every rank skips the same
steps and stops after the same step; a rank never leaves its peers waiting in a collective.
"""

from __future__ import annotations

import math
import signal
from types import FrameType

import torch
import torch.distributed as dist

from mimo.train.optim import StepOptimizer


class RunAborted(RuntimeError):
    """Training stopped on purpose (e.g. too many bad steps) after saving a checkpoint; the message says why."""


class StopSignal:
    """While active, SIGTERM only raises a flag that the step loop reads between steps.

    Use as a context manager around the loop; the previous handler comes back on exit. Outside the
    main thread (where Python cannot install handlers) it stays inactive.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def __enter__(self) -> StopSignal:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        except ValueError:
            self._installed = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


class StepGuard:
    """Agrees, once per step and on every rank, whether the step's loss is finite and whether to stop,
    and counts consecutive bad steps (skipped for a non-finite loss or gradient norm)."""

    def __init__(self, max_bad_steps: int, device: torch.device | str = "cpu"):
        self.max_bad_steps = max_bad_steps
        self.device = torch.device(device)
        self.signal = StopSignal()
        self.stop_requested = False
        self.consecutive_bad = 0
        self.total_bad = 0

    def agree(self, loss: float) -> bool:
        """Collective over the world: True when every rank's loss is finite. Also folds this rank's SIGTERM
        flag into `stop_requested`, identically on every rank."""
        flags = torch.tensor([float(not math.isfinite(loss)), float(self.signal.requested)], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flags)
        bad_loss, stop = flags.tolist()
        self.stop_requested = self.stop_requested or stop > 0
        return bad_loss == 0

    def record(self, stepped: bool) -> None:
        """Count the step's outcome (the optimizer's `stepped` is already the same on every rank)."""
        self.consecutive_bad = 0 if stepped else self.consecutive_bad + 1
        self.total_bad += not stepped

    @property
    def exhausted(self) -> bool:
        """True once `max_bad_steps` consecutive steps were skipped (never when max_bad_steps is 0)."""
        return 0 < self.max_bad_steps <= self.consecutive_bad


def skip_step(optimizer: StepOptimizer, step: int) -> tuple[bool, float, float]:
    """Drop this step's gradients without updating anything; same return shape as `StepOptimizer.step`."""
    optimizer.zero_grad()
    return False, float("nan"), optimizer.lr(step)
