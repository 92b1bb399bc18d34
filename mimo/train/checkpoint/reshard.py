"""Making every checkpointed tensor say which part of the full tensor it is, so DCP can reshard it.

DCP reshards by FQN, global shape and offsets. DTensors (FSDP2) carry those already, and plain
replicated tensors (DP) are whole. Tensor parallelism here (parallel/tensor.py) holds plain local
chunks under the single-device names; saved as they are, DCP would take one rank's chunk for the
whole tensor. So before saving and loading, each plain tensor whose shape differs from the full
model's in one dim is wrapped as a DTensor sharded on that dim over its module's TP mesh, or an
expert-parallel LM's expert weights on dim 0 over its ep mesh (parallel/expert/); an FSDP2 shard of
such a chunk becomes a DTensor over the 2-D (tp, dp) or (ep, edp) mesh, its chunk's dim over the first
and dim 0 over the second (the wrap shares storage, nothing is copied). The full shapes come from the
model built on the meta device.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from mimo.config.schema import ModelConfig
from mimo.hf.build import build_model
from mimo.models.multimodal import modules_by_name
from mimo.parallel.expert.layout import is_expert_key

MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def full_shapes(model_cfg: ModelConfig) -> dict[str, torch.Size]:
    """Full shape of every weight and optimizer moment, keyed `model.<module>.<name>` and
    `optim.<module>.<param>.<moment>` like the flattened training state. Allocates nothing."""
    with torch.device("meta"):
        model = build_model(model_cfg)
    shapes: dict[str, torch.Size] = {}
    for name, mod in modules_by_name(model).items():
        for k, v in mod.state_dict().items():
            shapes[f"model.{name}.{k}"] = v.shape
        for k, p in mod.named_parameters():
            for moment in MOMENTS:
                shapes[f"optim.{name}.{k}.{moment}"] = p.shape
    return shapes


def to_global(key: str, t: torch.Tensor, full: torch.Size | None, tp_mesh: DeviceMesh | None) -> torch.Tensor:
    """`t` as DCP must see it: unchanged when whole or already a DTensor of the full shape, else a
    DTensor view sharded on the one dim where it is smaller than `full`."""
    if full is None or t.shape == full:
        return t
    chunked = [d for d in range(t.dim()) if t.shape[d] != full[d]] if t.dim() == len(full) else []
    if isinstance(t, DTensor) and tp_mesh is not None and tp_mesh.ndim == 2 and len(chunked) == 1:
        # FSDP shards (dim 0 over the mesh's second dim) inside TP or ep chunks (their dim over its first)
        stride = torch.empty(full, device="meta").stride()
        return DTensor.from_local(t.to_local(), tp_mesh, [Shard(chunked[0]), Shard(0)], run_check=False,
                                  shape=full, stride=stride)
    if isinstance(t, DTensor):
        raise RuntimeError(f"checkpoint entry '{key}' is a DTensor of shape {tuple(t.shape)}, but the full tensor "
                           f"is {tuple(full)}, and its module has no 2-D (tp, dp) mesh to save it over (FSDP over "
                           "cp x dp of tensor-parallel chunks); use fsdp with tp = 1 or cp = 1 for this module")
    dims = [d for d in range(t.dim()) if t.shape[d] != full[d]] if t.dim() == len(full) else []
    if tp_mesh is None or len(dims) != 1 or t.shape[dims[0]] * tp_mesh.size() != full[dims[0]]:
        raise RuntimeError(f"checkpoint entry '{key}' has local shape {tuple(t.shape)} that is no tensor-parallel "
                           f"chunk of its full shape {tuple(full)}; it cannot be saved or resharded")
    return DTensor.from_local(t, tp_mesh, [Shard(dims[0])], run_check=False)


def globalize(tree: dict, shapes: dict[str, torch.Size], tp_meshes: dict[str, DeviceMesh],
              expert_mesh: DeviceMesh | None = None, prefix: str = "") -> dict:
    """The training-state tree with every tensor passed through `to_global` (module = second key part); an
    expert-parallel LM's expert weights and moments are chunks of dim 0 over `expert_mesh` (its ep group)."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out[k] = globalize(v, shapes, tp_meshes, expert_mesh, key)
        else:
            mesh = expert_mesh if expert_mesh is not None and is_expert_key(key) else tp_meshes.get(key.split(".")[1])
            out[k] = to_global(key, v, shapes.get(key), mesh)
    return out
