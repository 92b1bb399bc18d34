"""Copy Hugging Face tensors into a mimo module, one tensor (or one shard of it) at a time.

`load_hf_weights(module, source, mapping, shard_fn)` is the single entry point every importer uses. Under
tensor parallelism the module's parameters are already shards; `shard_fn` receives each parameter's name
and the lazy safetensors slice and returns this rank's piece, so a rank never reads the other ranks' rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from mimo.interop.hf_files import TensorSlice, WeightSource, open_source

ShardFn = Callable[[str, TensorSlice], torch.Tensor]


def load_hf_weights(module: nn.Module, source: str | Path | nn.Module | WeightSource, mapping: Mapping[str, str],
                    shard_fn: ShardFn | None = None) -> None:
    """Fill every parameter and persistent buffer of `module` from `source`.

    `mapping` maps each of the module's state-dict names to a tensor name in the source; every entry of the
    module's state dict must be covered. `shard_fn(name, tensor_slice)` (default: read the whole tensor)
    returns the piece for this process, which must match the parameter's (possibly sharded) shape.
    """
    targets = module.state_dict(keep_vars=True)
    uncovered = [n for n in targets if n not in mapping]
    if uncovered:
        raise ValueError(f"no Hugging Face tensor is mapped to {uncovered[:5]}{' ...' if len(uncovered) > 5 else ''}"
                         f" of {type(module).__name__}; the mapping does not fit this module's config")
    unknown = [n for n in mapping if n not in targets]
    if unknown:
        raise ValueError(f"the mapping names {unknown[:5]}, which {type(module).__name__} does not have")
    with open_source(source) as src:
        for name, hf_name in mapping.items():
            target = targets[name]
            tensor = shard_fn(name, src.get_slice(hf_name)) if shard_fn else src.get_slice(hf_name)[:]
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(f"tensor '{hf_name}' in '{src.where(hf_name)}' has shape {tuple(tensor.shape)}, "
                                 f"but mimo's '{name}' needs {tuple(target.shape)}; the checkpoint and the config "
                                 "(or the shard function) disagree")
            with torch.no_grad():
                target.copy_(tensor)


def dim_shard_fn(dim_of: Callable[[str], int | None], rank: int, world: int) -> ShardFn:
    """A `shard_fn` for even tensor-parallel splits: `dim_of(name)` gives the split dimension of a parameter
    (None = replicated); rank `rank` of `world` reads only its contiguous block along it."""

    def shard(name: str, sl: TensorSlice) -> torch.Tensor:
        dim = dim_of(name)
        if dim is None:
            return sl[:]
        size = sl.get_shape()[dim]
        if size % world:
            raise ValueError(f"'{name}' has {size} entries along dim {dim}, not divisible by {world} ranks")
        step = size // world
        index = (slice(None),) * dim + (slice(rank * step, (rank + 1) * step),)
        return sl[index]

    return shard


def find_prefix(source: WeightSource, anchor: str, what: str) -> str:
    """The key prefix under which `source` stores a component, found from one tensor it must have.

    Checkpoints nest the same weights differently ("model.", "language_model.model.", "vision_tower.",
    "vision_model.", ...); searching for the anchor tensor makes every layout work.
    """
    hits = sorted(k[: -len(anchor)] for k in source.keys()
                  if k == anchor or k.endswith("." + anchor))
    if not hits:
        raise ValueError(f"no tensor named '*{anchor}' in '{source.label}': it holds no {what}")
    if len(hits) > 1:
        raise ValueError(f"'{source.label}' holds several {what}s (prefixes {hits}); pass prefix= to choose one")
    return hits[0]
