"""Joining the process group that `torchrun` (or `mimo train --nproc N`) describes."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def launched_distributed() -> bool:
    """True when this process was started by torchrun with more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


GPU_BACKEND = "cpu:gloo,cuda:nccl"
"""On GPUs, CUDA tensors travel over NCCL and a tensor left on the host (a flag or count the host made)
over gloo: every collective works whichever side its tensor is on."""


_timeout: list[timedelta] = []
"""The timeout init_distributed gave the default group (empty before, or when a test harness joined it)."""


def group_timeout() -> timedelta | None:
    """The timeout for process groups made after the default one: the same parallel.timeout_s, or None
    (torch's default) when init_distributed did not create the default group."""
    return _timeout[-1] if _timeout else None


def init_distributed(device_type: str, timeout_s: float = 1800.0) -> tuple[int, int]:
    """Join the default process group (GPU_BACKEND on GPUs, gloo on CPUs); returns (rank, world size).
    Every collective of the group fails after `timeout_s` seconds without its peers (parallel.timeout_s)."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if not launched_distributed():
        return 0, 1
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    _timeout[:] = [timedelta(seconds=timeout_s)]
    dist.init_process_group(GPU_BACKEND if device_type == "cuda" else "gloo", timeout=_timeout[0])
    return dist.get_rank(), dist.get_world_size()


GLOO_TRANSPORT = "/gloo/transport/"
"""Where gloo's transport errors come from: torch raises them as a plain RuntimeError whose message starts with
that source location, `[.../gloo/transport/tcp/pair.cc:537] Read error ...: Connection reset by peer`."""


def collective_failed(e: BaseException) -> bool:
    """Whether `e` is a collective that timed out or lost its peers: one of torch.distributed's own error types
    (DistError; NCCL raises DistBackendError) or an error of gloo's transport (GLOO_TRANSPORT)."""
    if isinstance(e, dist.DistError):
        return True
    return isinstance(e, RuntimeError) and str(e).startswith("[") and GLOO_TRANSPORT in str(e).split("]", 1)[0]


def leave_distributed() -> None:
    """Destroy this process's process groups (no-op without one), at the end of a run that finished cleanly.

    Why explicitly: left to interpreter shutdown, gloo's worker threads can free tensors that still hold
    Python references after the interpreter is torn down, and the rank dies with SIGABRT after a
    successful run. Destroying the groups while the interpreter is whole joins those threads first.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    _timeout.clear()


def leave_if_joined() -> None:
    """leave_distributed, but only when init_distributed created the default group: a group the caller (a test
    harness, a script) joined itself is the caller's to leave. Not collective (destroying a group is local)."""
    if _timeout:
        leave_distributed()


def torchrun_cmd(nproc: int) -> list[str]:
    """The command that starts `nproc` local processes through torchrun (append `-m module ...`)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
