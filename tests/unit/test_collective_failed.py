"""`collective_failed` knows a failed collective by its error type: other errors, NCCL named in them or not, are
not taken for one."""

from __future__ import annotations

import torch.distributed as dist

from mimo.parallel.runtime import collective_failed


def test_only_collective_errors_are_taken_for_failed_collectives():
    assert collective_failed(dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error"))
    assert collective_failed(dist.DistNetworkError("connection to the store lost"))
    assert not collective_failed(RuntimeError("NCCL_P2P_LEVEL names no known level"))
    assert not collective_failed(RuntimeError("[enforce fail at the model] Timed out waiting for the user"))
    assert not collective_failed(ValueError("[x/gloo/transport/tcp/pair.cc:1] not a runtime error"))
