"""Expert parallelism for the LM: each rank of an ep group keeps 1/ep of every MoE layer's experts.

`parallel.modules.language.ep` carves the expert dim out of the LM's dp (mimo.parallel.grid's
`expert_groups`): ep consecutive dp ranks form an ep group and exchange tokens; the ranks holding the same
experts (every cp rank and every ep-th dp rank) form the edp group, over which those experts' gradients are
summed, and nowhere else. Everything that is not an expert weight (attention, router, shared expert, norms,
embeddings) stays data parallel over the LM's full dp x cp as before.

`shard_experts` keeps this rank's slice of dim 0 of each `w_gate`, `w_up`, `w_down` (on meta or real
tensors) with the all-to-all dispatcher (`MoEFeedForward.keep_experts`); the module's `expert_shard` tells
materialisation, gathers and checkpoints where a piece sits in the full tensor (`expert_slice`).
"""

from __future__ import annotations

from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.models.moe import EXPERT_WEIGHTS, MoEFeedForward
from mimo.parallel.comm import collective_device
from mimo.parallel.expert.dispatch import ExpertParallelDispatch
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout


def shard_experts(lm: nn.Module, rank: int, ep: int, group: ProcessGroup) -> None:
    """Keep experts [rank * E/ep, (rank + 1) * E/ep) of every MoE layer of `lm` and dispatch their tokens over
    `group` (the ep group, this rank `rank` of `ep`). Not collective; E divides by ep (the gate's check). Run
    after tensor parallelism: the slices keep the full weights' attributes (e.g. REPLICAS = tp)."""
    for moe in lm.modules():
        if isinstance(moe, MoEFeedForward):
            assert moe.num_experts % ep == 0, "validate_expert_parallel"
            moe.keep_experts(rank, ep, ExpertParallelDispatch(group))


def expert_slice(owner: nn.Module, pname: str) -> tuple[int, int] | None:
    """(rank, ep) where `pname` is an expert weight of `owner` sharded over ep ranks (dim 0), else None."""
    if pname.rsplit(".", 1)[-1] in EXPERT_WEIGHTS and isinstance(owner, MoEFeedForward):
        return owner.expert_shard
    return None


def expert_fsdp_units(lm: nn.Module, dp_mesh: DeviceMesh, edp: ProcessGroup) -> list[tuple[nn.Module, DeviceMesh]]:
    """apply_fsdp's `inner_units` for an expert-parallel `lm`: per MoE layer its router and shared expert over
    the LM's `dp_mesh`, then the layer itself (now holding just the experts) over the `edp` group's mesh, so
    experts are sharded and their gradients reduce-scattered over the ranks holding copies of them, nowhere
    else. Not collective."""
    edp_mesh = DeviceMesh.from_group(edp, dp_mesh.device_type, mesh_dim_names=("edp",))
    units = []
    for moe in lm.modules():
        if isinstance(moe, MoEFeedForward) and moe.expert_shard is not None:
            units += [(m, dp_mesh) for m in (moe.router, moe.shared, moe.shared_gate) if m is not None]
            units.append((moe, edp_mesh))
    return units


def expert_mesh(grid: Grid, ep: int, rank: int, groups: tuple[ProcessGroup, ProcessGroup],
                fsdp: bool) -> DeviceMesh:
    """Where this rank's expert weights sit, for checkpoints: the 1-D ep mesh, or with FSDP the 2-D
    (ep, edp) mesh (dim 0 cut into ep chunks, each chunk FSDP-sharded over edp). Not collective."""
    device = collective_device(groups[0]).type
    if not fsdp:
        return DeviceMesh.from_group(groups[0], device, mesh_dim_names=("ep",))
    views = grid.expert_groups(ep)
    edp = next(g for g in views["edp"] if rank in g)
    ep_of = {r: g for g in views["ep"] for r in g}
    plane = [[ep_of[m][e] for m in edp] for e in range(ep)]
    return DeviceMesh.from_group(list(groups), device, mesh=plane, mesh_dim_names=("ep", "edp"))


def expert_params(module: nn.Module) -> list[nn.Parameter]:
    """The sharded expert weights of `module`, in module order."""
    return [getattr(m, n) for m in module.modules() if isinstance(m, MoEFeedForward) and m.expert_shard is not None
            for n in EXPERT_WEIGHTS]


def is_expert_key(key: str) -> bool:
    """Whether a checkpoint key (`model.language.<param>` or `optim.language.<param>.<moment>`) names an
    expert weight or its optimizer state."""
    parts = key.split(".")
    return len(parts) > 2 and parts[1] == LANGUAGE and any(p in EXPERT_WEIGHTS for p in parts[-2:])


def expert_degree(cfg: Config) -> int:
    module = cfg.parallel.modules.get(LANGUAGE)
    return module.ep if module is not None else 1


def validate_expert_parallel(cfg: Config, layout: Layout) -> None:
    """parallel.modules.<name>.ep against the model and the layout (pure): the LM only, an MoE LM, ep divides
    its dp and moe_experts."""
    for name, module in cfg.parallel.modules.items():
        if module.ep < 1:
            raise ConfigError(f"parallel.modules.{name}.ep = {module.ep} must be >= 1 (1 = no expert parallelism)")
        if module.ep > 1 and name != LANGUAGE:
            raise ConfigError(f"parallel.modules.{name}.ep = {module.ep}: expert parallelism applies to the "
                              "language model's MoE layers only; use ep = 1")
    ep = expert_degree(cfg)
    if ep == 1:
        return
    llm, lm = cfg.model.llm, layout.grids[LANGUAGE]
    where = "parallel.modules.language.ep"
    if llm.moe_experts == 0:
        raise ConfigError(f"{where} = {ep} needs an MoE language model; set model.llm.moe_experts or ep = 1")
    if lm.dp % ep:
        raise ConfigError(f"{where} = {ep} must divide the LM's dp ({lm.dp}; experts are carved out of data "
                          f"parallelism only); choose a divisor of {lm.dp}")
    if llm.moe_experts % ep:
        raise ConfigError(f"{where} = {ep} must divide model.llm.moe_experts ({llm.moe_experts}); choose a divisor")

