"""The multi-process harness: results come back, failures and hangs surface fast and name the rank."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.support.dist import run_distributed

pytestmark = pytest.mark.slow


def _sum_ranks(rank: int, world_size: int, scale: int, *, offset: int) -> tuple[int, int, float, str]:
    x = torch.tensor([float(rank)])
    dist.all_reduce(x)
    return rank, world_size, x.item() * scale + offset, os.environ.get("MIMO_HARNESS_PROBE", "")


def _raise_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()


def _hang_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        dist.recv(torch.zeros(1), src=0)


def _return_unpicklable(rank: int, world_size: int) -> object:
    return lambda: rank


def _exit_silently(rank: int, world_size: int) -> None:
    os._exit(3)


def test_results_args_and_environment(monkeypatch):
    monkeypatch.setenv("MIMO_HARNESS_PROBE", "seen")
    out = run_distributed(_sum_ranks, 4, 10, offset=1)
    assert out == [(r, 4, 61.0, "seen") for r in range(4)]


def test_exception_names_rank_and_traceback():
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        run_distributed(_raise_on_rank_1, 2, timeout=60.0)
    msg = str(info.value)
    assert "rank 1 failed" in msg and "rank 0" not in msg
    assert "Traceback" in msg and "_raise_on_rank_1" in msg and "ValueError: boom on purpose" in msg
    assert time.monotonic() - start < 30.0


def test_hang_times_out_naming_the_rank():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timed out \(hang\?\) after 10 s; ranks still running: \[1\]"):
        run_distributed(_hang_on_rank_1, 2, timeout=10.0)
    assert time.monotonic() - start < 20.0


def test_unpicklable_result_and_silent_exit():
    with pytest.raises(RuntimeError, match="rank 0 failed:\nfn returned a value that cannot be sent back"):
        run_distributed(_return_unpicklable, 1)
    with pytest.raises(RuntimeError, match="rank 0 failed:\nprocess exited with code 3 before reporting"):
        run_distributed(_exit_silently, 1)
