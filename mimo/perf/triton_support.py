"""Whether mimo's Triton kernels can run here: Triton is optional (CPU-only installs may lack it).

On a CPU the kernels run in Triton's interpreter, which TRITON_INTERPRET=1 selects when a kernel is
defined, i.e. when mimo's kernel modules are imported: tests start a process of their own with it set.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton, tl = None, None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def unavailable(device: torch.device) -> str | None:
    """Why a Triton kernel cannot run on `device`, or None when it can (a GPU, or the CPU in Triton's
    interpreter)."""
    if triton is None:
        return "Triton is not installed (pip install triton)"
    if device.type == "cuda" or (device.type == "cpu" and INTERPRET):
        return None
    return (f"Triton runs its kernels on CUDA devices (or on the CPU in its interpreter, TRITON_INTERPRET=1), "
            f"not on {device}")
