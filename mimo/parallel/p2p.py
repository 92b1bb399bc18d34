"""Point-to-point messages between pipeline stages: lists of tensors, sent without blocking.

Why this shape:
- Sends never block (`isend`, kept in an `Outbox` until the step drains it), receives do. With every
  send asynchronous, a rank only ever waits for data a peer produces earlier in the schedule, so
  the 1F1B order alone rules out deadlock.
- Each direction of each rank pair has its own two-rank process group (`grid.pair_groups`). On NCCL a
  group is one communicator and one stream; sharing it between the activations going down and the
  gradients coming up would queue a rank's receive behind its own pending send.
- Forward messages carry a header (dtype and shape of every tensor), because row counts change with
  every microbatch. Backward messages do not: a gradient has the shape of the tensor it belongs to,
  which the receiver sent itself. Empty tensors are described by the header but never transferred.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.int32, torch.bool)
"""Dtypes a message may carry; a tensor's header entry is its index here."""

HEADER_LEN = 64
"""int64 entries of a message header: [tensor count, then per tensor: dtype index, ndim, *shape]."""

class Outbox:
    """Pending sends of one step: the tensors stay referenced until their send completes."""

    def __init__(self) -> None:
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, t: torch.Tensor, dst: int, group: ProcessGroup) -> None:
        t = t.detach().contiguous()
        self._pending.append((dist.isend(t, dst=dst, group=group), t))

    def drain(self) -> None:
        """Wait for every pending send; call once the step's schedule has finished."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()


def _header(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    entries = [len(tensors)]
    for t in tensors:
        if t.dtype not in DTYPES:
            raise ValueError(f"pipeline messages carry {DTYPES}; got a {t.dtype} tensor")
        entries += [DTYPES.index(t.dtype), t.dim(), *t.shape]
    if len(entries) > HEADER_LEN:
        raise ValueError(f"a pipeline message header holds {HEADER_LEN} entries; this one needs {len(entries)} "
                         "(too many or too high-dimensional tensors)")
    header = torch.zeros(HEADER_LEN, dtype=torch.long, device=device)
    header[: len(entries)] = torch.tensor(entries, dtype=torch.long)
    return header


def _specs(header: list[int]) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    specs, i = [], 1
    for _ in range(header[0]):
        dtype, ndim = DTYPES[header[i]], header[i + 1]
        specs.append((dtype, tuple(header[i + 2: i + 2 + ndim])))
        i += 2 + ndim
    return specs


def send_message(tensors: list[torch.Tensor], dst: int, group: ProcessGroup, outbox: Outbox) -> None:
    """Send a header then every non-empty tensor to `dst` (asynchronously, through `outbox`)."""
    outbox.send(_header(tensors, tensors[0].device), dst, group)
    send_payload(tensors, dst, group, outbox)


def send_payload(tensors: list[torch.Tensor], dst: int, group: ProcessGroup, outbox: Outbox) -> None:
    """Send every non-empty tensor to `dst`; the receiver must know their shapes (`recv_like`)."""
    for t in tensors:
        if t.numel():
            outbox.send(t, dst, group)


def recv_message(src: int, group: ProcessGroup, device: torch.device) -> list[torch.Tensor]:
    """Receive what `send_message` sent from `src` (blocking)."""
    header = torch.empty(HEADER_LEN, dtype=torch.long, device=device)
    dist.recv(header, src=src, group=group)
    return recv_like([torch.empty(shape, dtype=dtype, device=device) for dtype, shape in _specs(header.tolist())],
                     src, group)


def recv_like(buffers: list[torch.Tensor], src: int, group: ProcessGroup) -> list[torch.Tensor]:
    """Fill `buffers` (fresh tensors of the expected shapes) from `src`; empty ones are skipped."""
    for b in buffers:
        if b.numel():
            dist.recv(b, src=src, group=group)
    return buffers
