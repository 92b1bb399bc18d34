"""How many intra-op CPU threads a process uses: `train.threads`, or with 0 a count that does not collapse
on a busy machine.

torch's own default (one thread per core) spins its OpenMP workers at every barrier; on a machine whose
cores other processes already hold, each barrier waits for a descheduled worker and a step slows 10-20x
(benchmarks/reports/2026-12-01-cpu-threads.md). The automatic count takes the cores this process may run on
(`os.sched_getaffinity`), shares them among the node's processes (LOCAL_WORLD_SIZE, as torchrun sets it),
leaves out the cores the 1-minute load average says are busy, and caps the result at MAX_AUTO_THREADS."""

from __future__ import annotations

import math
import os

import torch

MAX_AUTO_THREADS = 16
"""Beyond this the small per-op work of one process stops scaling; a GPU run needs few host threads."""


def auto_threads(cores: int, local_processes: int, load: float) -> int:
    """Intra-op threads for one of `local_processes` processes sharing `cores` cores, `load` of which (the
    1-minute load average, taken before this run computes) other work already keeps busy. At least 1."""
    free = max(1, cores - math.floor(load))
    return max(1, min(free // max(1, local_processes), cores // max(1, local_processes), MAX_AUTO_THREADS))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def set_threads(threads: int) -> str | None:
    """Set torch's intra-op thread count: `threads` when > 0; with 0 OMP_NUM_THREADS when set (torch read it
    already), else auto_threads for this machine now. Returns a one-line note when the automatic count is
    below the usable cores (so a slow run says why), else None."""
    if threads > 0:
        torch.set_num_threads(threads)
        return None
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = usable_cores()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    n = auto_threads(cores, local, load)
    torch.set_num_threads(n)
    if n >= cores:
        return None
    return (f"mimo: {n} CPU thread(s) per process (train.threads = 0: {cores} usable cores, {local} local "
            f"process(es), load average {load:.1f}); set train.threads to choose")
