"""Per-block compilation, activation checkpointing of chosen blocks and the SDPA backend: switches applied
to an already built model, from outside.

Nothing here renames a module or a parameter: blocks are compiled in place (`nn.Module.compile`), and
checkpointed through hooks (PyTorch's composable `checkpoint`), so state dicts and tensor-parallel plans see
the same names as the eager model.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.nn.attention import SDPBackend

from mimo.config.schema import COMPILE_BACKENDS

SDPA_KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
SDPA_BACKENDS = (*SDPA_KERNELS, "default")
"""What `use_sdpa_backend` takes: one kernel, or "default" (every kernel allowed, PyTorch picks)."""


def compile_blocks(blocks: Iterable[nn.Module], mode: str | None = None, backend: str = "inductor") -> None:
    """Compile each block in place. Identical blocks share one compiled graph (parameters are graph
    inputs), so a 28-layer stack compiles like one layer, and a graph break stays inside one block.
    `mode` is torch.compile's ("reduce-overhead": replay each block as CUDA graphs), `backend` one of
    COMPILE_BACKENDS.

    Works on every layout: Dynamo traces the collectives of mimo.parallel.comm (tensor, sequence and
    context parallelism, inside a block) as functional collectives, so such a block is one graph with its
    collectives and their adjoints in it; FSDP2's hooks stay outside the graph (FSDP2 runs them eagerly),
    so under FSDP the graph is a block's compute between its all-gather and its reduce-scatter.
    """
    if backend not in COMPILE_BACKENDS:
        raise ValueError(f"unknown torch.compile backend '{backend}'; choose one of {', '.join(COMPILE_BACKENDS)}")
    options = {"backend": backend} if mode is None else {"backend": backend, "mode": mode}
    for block in blocks:
        block.compile(**options)


def checkpoint_blocks(blocks: Iterable[nn.Module]) -> None:
    """Keep only the inputs of these blocks in forward and recompute the rest in backward.

    PyTorch's composable `checkpoint` (non-reentrant, as FSDP2 composes with it): hooks on each block, no
    wrapper module, so every parameter keeps its name. Applied before `compile_blocks`, the checkpoint is traced
    into each compiled block.
    """
    for block in blocks:
        checkpoint(block)


def use_sdpa_backend(name: str) -> None:
    """Allow exactly one scaled-dot-product-attention backend, process-wide ("default": all of them again).

    Set before the first compiled call: a compiled graph picks its kernel when it is traced. With one
    backend allowed, an input it cannot take fails loudly instead of silently falling back to math.

    torch.compile's on-disk caches do not key on this choice, so a graph traced under one backend would be
    reused under another (a run asking for cuDNN got the flash kernels of an earlier run): each backend
    compiles into a cache folder of its own, below the default one or `TORCHINDUCTOR_CACHE_DIR`. Caches
    that inductor already holds in memory are not moved, so call this before anything is compiled.
    """
    if name not in SDPA_BACKENDS:
        raise ValueError(f"unknown SDPA backend '{name}'; choose one of {', '.join(SDPA_BACKENDS)}")
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = cache_dir()
    if os.path.basename(root) in {f"sdpa-{b}" for b in SDPA_BACKENDS}:  # an earlier call's folder
        root = os.path.dirname(root)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, f"sdpa-{name}")
    every = name == "default"
    torch.backends.cuda.enable_flash_sdp(every or name == "flash")
    torch.backends.cuda.enable_cudnn_sdp(every or name == "cudnn")
    torch.backends.cuda.enable_mem_efficient_sdp(every or name == "efficient")
    torch.backends.cuda.enable_math_sdp(every or name == "math")

