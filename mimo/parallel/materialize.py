"""Where each of a rank's parameters sits in the full single-process tensor, after the layout cut it.

A model laid out on the meta device (tensor-parallel slices, pipeline stages, FSDP2 shards) holds only
this rank's pieces. `local_view` names, for every parameter, the index of its piece in the full tensor
(the TP chunk along its split dim or an expert-parallel rank's experts, then the FSDP shard inside that)
and the tensor that holds it (a DTensor's local shard). `mimo.models.init.materialize` fills the pieces
from the seeded full tensors; `mimo.hf.load` reads the same pieces out of safetensors files. Neither communicates.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from mimo.config.schema import LANGUAGE
from mimo.models.init import Index, LocalView
from mimo.parallel.expert.layout import expert_slice
from mimo.parallel.tensor import tp_shard_dim

TPRank = Callable[[str], tuple[int, int]]
"""module name ("language" or a modality) -> (this rank's TP rank, the module's tp)."""


def module_of(pname: str) -> str:
    """The `parallel.modules` name of a MimoModel parameter: "language" or its modality."""
    return LANGUAGE if pname.startswith("language_model.") else pname.split(".")[1]


def local_view(model: nn.Module, full_shapes: dict[str, tuple[int, ...]], tp_rank: TPRank,
               prefix: str = "") -> LocalView:
    """The `LocalView` of a laid-out `model` whose parameters' full shapes are `full_shapes` (keyed by the
    MimoModel names; `prefix` + a name of `model` gives that key)."""
    def view(name: str, p: torch.Tensor) -> tuple[Index, torch.Tensor]:
        key = prefix + name
        full = full_shapes[key]
        starts, sizes = [0] * len(full), list(full)
        owner = model.get_submodule(name.rpartition(".")[0])
        dim = tp_shard_dim(owner, key)
        rank, tp = tp_rank(module_of(key))
        if dim is not None and tp > 1:
            sizes[dim] = full[dim] // tp
            starts[dim] = rank * sizes[dim]
        experts = expert_slice(owner, key)
        if experts is not None:  # this rank's experts: its slice of dim 0
            sizes[0] = full[0] // experts[1]
            starts[0] = experts[0] * sizes[0]
        target = p
        if isinstance(p, DTensor):
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
            for d, (n, o) in enumerate(zip(shape, offset)):
                starts[d] += o
                sizes[d] = n
            target = p.to_local()
        if tuple(target.shape) != tuple(sizes):
            raise AssertionError(f"'{key}': local shape {tuple(target.shape)} is not the piece {sizes} of {full}")
        return tuple(slice(s, s + n) for s, n in zip(starts, sizes)), target

    return view
