"""Per-block compilation, activation checkpointing of chosen blocks and the SDPA backend: switches applied
to an already built model, from outside.

Nothing here renames a module or a parameter: blocks are compiled in place (`nn.Module.compile`), and
checkpointing swaps one block's bound `forward`, so state dicts and tensor-parallel plans see the same
names as the eager model.
"""

from __future__ import annotations

import types
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math")


def compile_blocks(blocks: Iterable[nn.Module]) -> None:
    """Compile each block in place. Identical blocks share one compiled graph (parameters are graph
    inputs), so a 28-layer stack compiles like one layer, and a graph break stays inside one block."""
    for block in blocks:
        block.compile()


def _checkpointed_forward(self: nn.Module, *args, **kwargs):
    return checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(blocks: Iterable[nn.Module]) -> None:
    """Keep only the inputs of these blocks in forward and recompute the rest in backward.

    Applied before `compile_blocks`, the checkpoint is traced into the compiled graph. Every instance
    gets the same bound function (not a closure per block), so compiled blocks still share guards.
    """
    for block in blocks:
        block.forward = types.MethodType(_checkpointed_forward, block)


def use_sdpa_backend(name: str) -> None:
    """Allow exactly one scaled-dot-product-attention backend, process-wide.

    Set before the first compiled call: a compiled graph picks its kernel when it is traced. With one
    backend allowed, an input it cannot take fails loudly instead of silently falling back to math.
    """
    if name not in SDPA_BACKENDS:
        raise ValueError(f"unknown SDPA backend '{name}'; choose one of {', '.join(SDPA_BACKENDS)}")
    torch.backends.cuda.enable_flash_sdp(name == "flash")
    torch.backends.cuda.enable_cudnn_sdp(name == "cudnn")
    torch.backends.cuda.enable_mem_efficient_sdp(name == "efficient")
    torch.backends.cuda.enable_math_sdp(name == "math")

