"""One verdict for every rank: each rank brings what it found wrong (or nothing), all leave with the same answer.

Used where ranks read files of their own (a checkpoint's parts, the run folder) and must then take the
same branch, so that no rank enters a collective its peers skipped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

MAX_BYTES = 4096
"""The longest message that travels (UTF-8 bytes); a longer one is cut."""


def first_problem(problem: str) -> tuple[int, str]:
    """Collective over the default group (plain return without one): (rank, problem) of the lowest rank
    that has one, on every rank, or (-1, "") when no rank has any. Two small collectives over host
    tensors (gloo, also beside NCCL)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return (0, problem) if problem else (-1, "")
    rank, world = dist.get_rank(), dist.get_world_size()
    first = torch.tensor([rank if problem else world], dtype=torch.int64, device="cpu")
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    source = int(first.item())
    if source == world:
        return -1, ""
    message = torch.zeros(MAX_BYTES + 1, dtype=torch.uint8, device="cpu")
    if rank == source:
        data = problem.encode()[:MAX_BYTES]
        message[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(message, src=source)
    text = bytes(message.tolist()).split(b"\0", 1)[0].decode(errors="replace")
    return source, text
