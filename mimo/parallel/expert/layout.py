"""Expert parallelism for the LM: each rank of an ep group keeps 1/ep of every MoE layer's experts.

`parallel.modules.language.ep` carves the expert dim out of the LM's dp (mimo.parallel.grid's
`expert_groups`): ep consecutive dp ranks form an ep group and exchange tokens; the ranks holding the same
experts (every cp rank and every ep-th dp rank) form the edp group, over which those experts' gradients are
summed, and nowhere else. Everything that is not an expert weight (attention, router, shared expert, norms,
embeddings) stays data parallel over the LM's full dp x cp as before.

`shard_experts` keeps this rank's slice of dim 0 of each `w_gate`, `w_up`, `w_down` (on meta or real
tensors) and installs the all-to-all dispatcher; the owner module records its slice under EXPERT_SLICE so
materialisation, gathers and checkpoints find where a piece sits in the full tensor (`expert_slice`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed import ProcessGroup

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.models.moe import MoEFeedForward
from mimo.parallel.expert.dispatch import ExpertParallelDispatch
from mimo.parallel.layout import Layout
from mimo.parallel.pipeline.plan import is_pipelined

EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")
"""The stacked expert weights of a MoEFeedForward, dim 0 the expert."""

EXPERT_SLICE = "_mimo_expert_slice"
"""MoEFeedForward attribute: (this rank's index in its ep group, ep) once its experts are sharded."""


def shard_experts(lm: nn.Module, rank: int, ep: int, group: ProcessGroup) -> None:
    """Keep experts [rank * E/ep, (rank + 1) * E/ep) of every MoE layer of `lm` and dispatch their tokens over
    `group` (the ep group, this rank `rank` of `ep`). Not collective; E divides by ep (the gate's check). Run
    after tensor parallelism: the slices keep the full weights' attributes (e.g. REPLICAS = tp)."""
    for moe in lm.modules():
        if not isinstance(moe, MoEFeedForward):
            continue
        local = moe.num_experts // ep
        assert local * ep == moe.num_experts, "validate_expert_parallel"
        for name in EXPERT_WEIGHTS:
            full = getattr(moe, name)
            piece = full.detach()[rank * local:(rank + 1) * local]
            piece = torch.empty_like(piece) if piece.is_meta else piece.clone()
            param = nn.Parameter(piece, requires_grad=full.requires_grad)
            param.__dict__.update(vars(full))  # REPLICAS (TP-replicated copies), TP_PARTIAL_GRAD, the init rule
            setattr(moe, name, param)
        setattr(moe, EXPERT_SLICE, (rank, ep))
        moe.expert_offset = rank * local
        moe.dispatcher = ExpertParallelDispatch(group)


def expert_slice(owner: nn.Module, pname: str) -> tuple[int, int] | None:
    """(rank, ep) where `pname` is an expert weight of `owner` sharded over ep ranks (dim 0), else None."""
    if pname.rsplit(".", 1)[-1] in EXPERT_WEIGHTS and hasattr(owner, EXPERT_SLICE):
        return getattr(owner, EXPERT_SLICE)
    return None


def expert_params(module: nn.Module) -> list[nn.Parameter]:
    """The sharded expert weights of `module`, in module order."""
    return [getattr(m, n) for m in module.modules() if hasattr(m, EXPERT_SLICE) for n in EXPERT_WEIGHTS]


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
    its dp and moe_experts, and none of the combinations expert parallelism does not support yet."""
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
    _refuse_unsupported(cfg, layout, ep)


def _refuse_unsupported(cfg: Config, layout: Layout, ep: int) -> None:
    """The layouts and features expert parallelism is not built for yet, each refused by its field."""
    module, lm = cfg.parallel.modules[LANGUAGE], layout.grids[LANGUAGE]
    where = f"parallel.modules.language.ep = {ep}"
    refusals = [
        (module.fsdp, "with fsdp = true is not supported yet; set fsdp = false"),
        (module.sequence_parallel and lm.tp > 1, "with sequence_parallel = true is not supported yet; set it false"),
        (lm.cp > 1, "with cp > 1 is not supported yet; set parallel.modules.language.cp = 1"),
        (is_pipelined(layout), "on a pipelined layout (modules on disjoint ranks or pp > 1) is not supported yet; "
         "colocate the modules with pp = 1"),
        (cfg.train.master_weights, "with train.master_weights = true is not supported yet; set it false"),
        (bool(cfg.model.llm.hf_path), "with model.llm.hf_path is not supported yet; train from the config's shapes"),
    ]
    for refused, why in refusals:
        if refused:
            raise ConfigError(f"{where} {why}")

