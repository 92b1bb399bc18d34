"""`perf.encoder_offload`: encoders' weights and optimizer states in host memory while a colocated layout's LM
pipeline runs (mimo.parallel.pipeline.colocated), moved storage by storage so every tensor keeps its identity.

`HostOffload.out` copies each storage's bytes to a host buffer and empties the storage (`resize_(0)`, as FSDP2
frees its unsharded parameters); `back` refills it and copies the bytes in. Parameters, their views, an FSDP2
DTensor's local shard, the optimizer's per-parameter state and the autograd graph's saved references to the
weights all see the same values again: the bytes are copied, never recomputed. On CUDA the copies are queued on
the current stream from and into pinned buffers (non_blocking), kept from step to step; the caching allocator
reuses a freed block only after the queued copy out of it.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's own storage holder: a DTensor's local shard, any other tensor itself."""
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of `storage` (its own version counter: writing it does not touch the owners')."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),))


class HostOffload:
    """Storages of tensors moved to host memory and back, in place. Per step: `out(tensors)`, then `back()`
    before any of them is read again. Not collective."""

    def __init__(self) -> None:
        self.moved: list[tuple[torch.UntypedStorage, torch.Tensor]] = []
        self.buffers: list[torch.Tensor] = []

    def out(self, tensors: list[torch.Tensor], keep: list[torch.Tensor]) -> None:
        """Copy every distinct non-empty storage of `tensors` (DTensors: their local shards) to the host and free
        it on its device, except a storage that one of `keep` also lives in (flat buffers shared with weights
        still in use)."""
        kept = {t.untyped_storage().data_ptr() for t in local_tensors(keep)}
        storages: dict[int, torch.UntypedStorage] = {}
        for t in local_tensors(tensors):
            s = t.untyped_storage()
            if s.nbytes() and s.data_ptr() not in kept:
                storages.setdefault(s.data_ptr(), s)
        for i, s in enumerate(storages.values()):
            if i == len(self.buffers) or self.buffers[i].numel() != s.nbytes():
                pin = s.device.type == "cuda"
                buffer = torch.empty(s.nbytes(), dtype=torch.uint8, pin_memory=pin)
                self.buffers[i:i + 1] = [buffer]
            self.buffers[i].copy_(_bytes_of(s), non_blocking=True)
            s.resize_(0)
            self.moved.append((s, self.buffers[i]))
        del self.buffers[len(storages):]

    def back(self) -> None:
        """Refill every storage `out` emptied with its bytes, in place."""
        for s, buffer in self.moved:
            s.resize_(buffer.numel())
            _bytes_of(s).copy_(buffer, non_blocking=True)
        self.moved = []
