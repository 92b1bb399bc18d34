"""Host memory handed back as soon as a large tensor is freed: `train.host_mmap_threshold_mb`.

glibc's malloc serves a block of at least its mmap threshold with its own mapping, which `free` unmaps at
once; smaller blocks come from its heaps, which keep freed memory resident until the top of a heap is free.
The threshold starts at 128 KiB but rises to the size of each mapped block freed (up to 32 MiB), so after a
few steps most of a training step's tensors (a layer's weights and gradients gathered by FSDP2, activations,
gloo's buffers) come from the heaps, and the freed gaps between them stay resident: 0.3-0.4 GiB more per
process in benchmarks/bench_memory.py (BENCHMARKS.md). Fixing the threshold (which also stops it rising)
returns that memory, at the cost of fresh zero pages for each large allocation.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter number for the mmap threshold (malloc.h)."""


def set_mmap_threshold(megabytes: int) -> bool:
    """Fix glibc's mmap threshold at `megabytes` MiB for this process (0: leave glibc's rising default).
    Returns whether it was set: False for 0 and where the C library is not glibc (no mallopt)."""
    if megabytes <= 0:
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, megabytes << 20))
