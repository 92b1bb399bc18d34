"""Run a test function on N gloo processes and turn any rank's failure or hang into a test failure.

Each rank reports over its own pipe as soon as `fn` returns or raises, so the parent can fail fast
(killing the other ranks) instead of waiting for a timeout, and can name the ranks that never
reported when something hangs. `fn` must be a module-level function: it is pickled by name.

Ranks are forked from a "forkserver" that imported torch once, because a fresh "spawn" re-imports
torch in every rank: 1-2 s each, 15 s for 8 ranks on a busy 2-core machine, against 0.2 s here.
A forked rank would inherit the server's environment and working directory, so the parent's
current ones travel with each launch, as they would under spawn.

`MIMO_TEST_BACKEND=nccl` runs the same functions on GPUs, one per rank, over NCCL (host tensors over
gloo beside it, as `mimo train` does on GPUs): every tensor made without a device lands on the rank's
GPU, TF32 is off so fp32 stays fp32, and a run wider than the GPUs present is skipped.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from mimo.parallel.runtime import GPU_BACKEND

_GRACE_S = 0.5
"""After the first failure, how long to collect other ranks' reports before killing them."""


@dataclass(frozen=True)
class _Launch:
    """What every rank of one run needs besides fn and its arguments."""

    world_size: int
    store: str  # the rendezvous file: a TCP port picked free by the parent could be taken before rank 0 binds it
    timeout: float
    env: dict[str, str]
    cwd: str


def backend() -> str:
    """The test backend: "gloo" (CPU processes, the default) or "nccl" (one GPU per rank)."""
    name = os.environ.get("MIMO_TEST_BACKEND", "gloo")
    if name not in ("gloo", "nccl"):
        raise ValueError(f"MIMO_TEST_BACKEND={name!r}; use gloo or nccl")
    return name


def rank_device() -> torch.device:
    """Where this rank's tensors live: its GPU on the nccl backend, else the CPU (call inside a rank)."""
    return torch.device("cuda", torch.cuda.current_device()) if backend() == "nccl" else torch.device("cpu")


class _OnGpu(TorchFunctionMode):
    """Tensor factories without a device build on `device`, as under torch.set_default_device; one drawn
    from a CPU generator is drawn on the CPU and moved, so a test's seeded data is the same as on gloo.

    It also moves library code's device-less tensors, so these suites cannot catch a missing `.to(device)`;
    tests/gpu/test_multi_gpu.py, which trains through `mimo train` without it, covers real placement."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _device_constructors() and kwargs.get("device") is None:
            gen = kwargs.get("generator")
            if gen is not None and gen.device.type == "cpu":
                return func(*args, **kwargs).to(self.device)
            kwargs["device"] = self.device
        return func(*args, **kwargs)


def _join(rank: int, launch: _Launch) -> contextlib.AbstractContextManager:
    """Join the group on the test backend; the context the test function runs in."""
    init = dict(rank=rank, world_size=launch.world_size, init_method=f"file://{launch.store}",
                timeout=timedelta(seconds=launch.timeout))
    if backend() == "gloo":
        dist.init_process_group("gloo", **init)
        return contextlib.nullcontext()
    torch.cuda.set_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group(GPU_BACKEND, **init)
    return _OnGpu(torch.device("cuda", rank))


def _context() -> mp.context.BaseContext:
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


def _worker(rank: int, launch: _Launch, conn: Connection, fn: Any, args: tuple, kwargs: dict) -> None:
    """Child side: join the group, run fn, report, then meet the other ranks and tear down."""
    os.environ.clear()
    os.environ.update(launch.env)
    os.chdir(launch.cwd)
    torch.set_num_threads(1)
    try:
        with _join(rank, launch):
            report = ("ok", fn(rank, launch.world_size, *args, **kwargs))
    except BaseException:
        report = ("error", traceback.format_exc())
    try:
        conn.send(report)
    except Exception:
        conn.send(("error", f"fn returned a value that cannot be sent back:\n{traceback.format_exc()}"))
    if report[0] == "ok":
        dist.barrier()
        dist.destroy_process_group()
    else:
        # stay up until the parent kills us: exiting would drop connections and make the other
        # ranks report secondary "connection closed" errors that bury the real one
        time.sleep(launch.timeout)


def run_distributed(fn: Any, world_size: int, *args: Any, timeout: float = 120.0, **kwargs: Any) -> list[Any]:
    """Run fn(rank, world_size, *args, **kwargs) on world_size processes; return each rank's result.

    Raises RuntimeError naming the failed rank(s) with their tracebacks, or naming the ranks still
    running after `timeout` seconds. On the nccl backend, skips when there are fewer GPUs than ranks.
    """
    if backend() == "nccl" and world_size > torch.cuda.device_count():
        pytest.skip(f"{world_size} ranks need {world_size} GPUs on MIMO_TEST_BACKEND=nccl; "
                    f"{torch.cuda.device_count()} found")
    ctx = _context()
    # the ranks' own dist timeout bounds how long they could outlive a parent that died
    store_dir = tempfile.mkdtemp(prefix="mimo-dist-")
    launch = _Launch(world_size, os.path.join(store_dir, "store"), timeout + 60.0, dict(os.environ), os.getcwd())
    procs: list[mp.process.BaseProcess] = []
    pending: dict[Connection, int] = {}
    try:
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, name=f"rank{rank}", args=(rank, launch, send, fn, args, kwargs))
            p.start()
            send.close()
            procs.append(p)
            pending[recv] = rank
        return _collect(procs, pending, time.monotonic() + timeout, timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join()
        shutil.rmtree(store_dir, ignore_errors=True)


def _collect(procs: list[mp.process.BaseProcess], pending: dict[Connection, int], deadline: float,
             timeout: float) -> list[Any]:
    """Parent side: gather reports until all ranks succeed, one fails, or the deadline passes."""
    results: list[Any] = [None] * len(procs)
    failures: list[str] = []
    while pending:
        left = deadline - time.monotonic()
        if not failures and left <= 0:
            raise RuntimeError(f"run_distributed timed out (hang?) after {timeout:.0f} s; ranks still "
                               f"running: {sorted(pending.values())}")
        ready = wait(list(pending), timeout=_GRACE_S if failures else left)
        if failures and not ready:
            break
        for conn in ready:
            rank = pending.pop(conn)
            try:
                status, payload = conn.recv()
            except EOFError:
                procs[rank].join(1.0)
                status, payload = "error", f"process exited with code {procs[rank].exitcode} before reporting"
            if status == "ok":
                results[rank] = payload
            else:
                failures.append(f"rank {rank} failed:\n{payload}")
    if failures:
        raise RuntimeError("\n".join(failures))
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0))
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    if stuck:
        raise RuntimeError(f"run_distributed timed out (hang?) in teardown after {timeout:.0f} s; ranks "
                           f"still running: {stuck}")
    return results
