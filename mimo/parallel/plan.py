"""A rank's parallel plan: the layout, its process groups, and what the trainer asks of it. The layout rules
the validation gate runs before any of this is built are `mimo.parallel.layout_rules`.

Built identically on every rank, from a config the gate has passed. One process has a plan too: every module
whole on its one rank, no process group, and every service below the identity (no collective).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from mimo.config.schema import LANGUAGE, Config
from mimo.data.batching import split_microbatches
from mimo.models.init import INIT_SPECS, LocalView, is_on_meta, materialize, whole
from mimo.models.multimodal import MimoModel, modules_by_name, out_key
from mimo.models.runtime import ModelRuntime
from mimo.parallel.bridge.colocated import ColocatedBridge
from mimo.parallel.context import ContextParallel
from mimo.parallel.data import (
    BF16_COMPUTE,
    REPLICAS,
    GradReducer,
    apply_fsdp,
    norm_sq_reducer,
)
from mimo.parallel.expert.layout import (
    expert_degree,
    expert_fsdp_units,
    expert_mesh,
    expert_params,
    expert_slice,
    shard_experts,
)
from mimo.parallel.expert.rows import share_row_stats
from mimo.parallel.grid import Grid, GridGroups
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import batch_multiple
from mimo.parallel.materialize import local_view
from mimo.parallel.pipeline.colocated import ColocatedPipelinePlan
from mimo.parallel.pipeline.plan import PipelinePlan
from mimo.parallel.pipeline.rules import colocated_pipeline, is_pipelined
from mimo.parallel.tensor import (
    TP_PARTIAL_GRAD,
    mark_tp_replicated,
    parallelize_lm,
    parallelize_vit,
    sequence_gather,
    sequence_shard,
    sync_sequence_parallel_grads,
    tp_lm_logits,
    tp_lm_loss,
    tp_shard_dim,
)


class ParallelPlan:
    """Grids and groups of every module, and the per-step services the trainer needs. On one process (`world`
    1) each module's grid is one rank, parallel.modules unread (as the gate reads it only over several ranks)."""

    def __init__(self, cfg: Config, rank: int = 0, world: int = 1):
        if world == 1:
            cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, modules={}))
        self.cfg, self.rank, self.world = cfg, rank, world
        names = cfg.model.module_names
        self.layout = Layout.from_config(cfg.parallel.modules, names, world)
        self.module_cfg = {n: cfg.parallel.modules.get(n) for n in names}
        built: dict[Grid, GridGroups] = {}
        self.groups: dict[str, GridGroups] = {}
        for name, grid in self.layout.grids.items():
            if grid not in built:
                built[grid] = grid.build(name)
            self.groups[name] = built[grid]
        # Disjoint grids, a pipelined lone module or a pipelined LM beside colocated encoders run the 1F1B schedule;
        # its bridges replace the colocated ones.
        self.pipeline = None
        if is_pipelined(self.layout):
            kind = ColocatedPipelinePlan if colocated_pipeline(self.layout) else PipelinePlan
            self.pipeline = kind(cfg, self.layout, self.groups, rank)
        self.bridges = {} if self.pipeline is not None else {
            n: ColocatedBridge(self.layout.grids[n], self.layout.grids[LANGUAGE]) for n in cfg.model.modalities}
        self.reducers: dict[str, GradReducer] = {}
        self.row_tokens: dict[str, dict[str, int]] = {}
        # One process: None, the optimizer's own sum of its modules' squared norms.
        self.norm_sq_reduce = norm_sq_reducer(names) if world > 1 else None
        lm = self.layout.grids[LANGUAGE]
        sp_tp = lm.tp if self._flag(LANGUAGE, "sequence_parallel") else 1
        held = lm.cp > 1 and self.holds(LANGUAGE)
        self.context = ContextParallel(self.groups[LANGUAGE].group("cp"), sp_tp) if held else None
        if self.pipeline is not None:
            self.pipeline.context = self.context
        # Expert parallelism: the LM's ep groups (tokens exchanged) and edp groups (expert gradients summed).
        self.ep = expert_degree(cfg)
        self.expert_groups = lm.build_expert(self.ep, LANGUAGE) if self.ep > 1 else (None, None)

    def _flag(self, name: str, field: str) -> bool:
        m = self.module_cfg[name]
        return bool(m is not None and getattr(m, field))

    def parallelize(self, model: MimoModel,
                    compute_paths: Callable[[MimoModel, ModelRuntime], ModelRuntime] | None = None,
                    device: torch.device | str = "cpu") -> None:
        """Lay the full model out in place, in one order: TP (+SP) per module, the bridges, the pipeline
        split, CP; then `compute_paths`, the caller's changes to how blocks compute (mimo.perf's fused q/k/v,
        activation checkpointing, torch.compile: torchtitan's order, so that FSDP2 wraps compiled,
        checkpointed blocks), which takes the layout's runtime and returns it with its own loss or precision;
        the model is given that runtime (`MimoModel.set_runtime`); then DP per module.

        A model built on the meta device (mimo.models.build) is laid out there and only then materialised on
        `device`: each rank allocates and initialises just its own TP slices, stage and FSDP shards, with the
        values of the single-process model (`materialize_local`). A materialised model is sliced as it is.

        Not collective except FSDP's construction; build the optimizer afterwards.
        """
        on_meta = is_on_meta(model)
        lm_tp = self.groups[LANGUAGE].group("tp")
        sp = self._flag(LANGUAGE, "sequence_parallel")
        runtime = ModelRuntime()
        if self.layout.grids[LANGUAGE].tp > 1 and self.holds(LANGUAGE):
            parallelize_lm(model.language_model, lm_tp, sp)
            runtime = dataclasses.replace(runtime, loss_fn=tp_lm_loss(lm_tp, sp), logits_fn=tp_lm_logits(lm_tp, sp))
            if sp:
                runtime = dataclasses.replace(runtime, shard_sequence=sequence_shard(lm_tp),
                                              gather_sequence=sequence_gather(lm_tp))
        if self.ep > 1 and self.holds(LANGUAGE):
            group = self.expert_groups[0]
            shard_experts(model.language_model, dist.get_rank(group), self.ep, group)
        for name, sub in model.modality_submodules.items():
            tp = self.layout.grids[name].tp
            if tp > 1 and self.holds(name):
                parallelize_vit(sub.encoders["vit"], self.groups[name].group("tp"),
                                self._flag(name, "sequence_parallel"))
                mark_tp_replicated(sub, tp)
        runtime = self.install_bridges(model, runtime)
        if self.pipeline is not None:
            self.pipeline.split(model)
        if self.context is not None:
            runtime = self.context.apply(model, runtime)
        self.share_router_rows(model)
        if compute_paths is not None:
            runtime = compute_paths(model, runtime)
        model.set_runtime(runtime)
        self.apply_data_parallel(model, sharded=True)
        if on_meta:
            self.materialize_local(model, device)
        self.apply_data_parallel(model, sharded=False)
        self.reducers.update(self.pipeline.out_path_reducers(model) if self.pipeline is not None else {})

    def share_router_rows(self, model: MimoModel) -> None:
        """Where the LM's rows are split (sequence parallel: over tp; context parallel: over cp), the MoE layers'
        per-row router statistics are summed over those ranks (mimo.parallel.expert.rows)."""
        grid = self.layout.grids[LANGUAGE]
        dims = (("tp",) if self._flag(LANGUAGE, "sequence_parallel") and grid.tp > 1 else ()) + (
            ("cp",) if grid.cp > 1 else ())
        if dims and self.holds(LANGUAGE):
            share_row_stats(model.language_model, self.groups[LANGUAGE].group(dims),
                            self.groups[LANGUAGE].size_of(dims), grid.cp)

    def tp_rank(self, name: str) -> tuple[int, int]:
        """(this rank's TP rank, the tp) of module `name`; (0, 1) where it holds no TP shard (a pipeline's Out path)."""
        return (self.groups[name].rank_in("tp"), self.layout.grids[name].tp) if self.holds(name) else (0, 1)

    def local_view(self, model: MimoModel) -> LocalView:
        """Where each of this rank's parameters sits in the full tensor (mimo.parallel.materialize); `whole` on
        one process."""
        if self.world == 1:
            return whole
        specs = getattr(model, INIT_SPECS)
        return local_view(model, {k: s.shape for k, s in specs.items()}, self.tp_rank)

    def materialize_local(self, model: MimoModel, device: torch.device | str) -> None:
        """Allocate this rank's pieces of a laid-out meta model on `device` and fill them from the seeded full
        tensors, one parameter at a time (peak: the largest full tensor). Not collective."""
        replicas = {n: getattr(p, REPLICAS) for n, p in model.named_parameters() if hasattr(p, REPLICAS)}
        partial = {n for n, p in model.named_parameters() if getattr(p, TP_PARTIAL_GRAD, False)}
        materialize(model, getattr(model, INIT_SPECS), device, self.local_view(model))
        for n, p in model.named_parameters():
            if n in replicas:
                setattr(p, REPLICAS, replicas[n])
            if n in partial:
                setattr(p, TP_PARTIAL_GRAD, True)

    def apply_data_parallel(self, model: MimoModel, sharded: bool) -> None:
        """For every module with more than one data lane here: FSDP2 (`sharded`, on meta or real parameters)
        or else a bucketed gradient all-reduce over the materialised parameters (an expert-parallel LM's
        expert weights over their edp group, the rest over all its lanes)."""
        for name, module in modules_by_name(model).items():
            lanes = self.data_dims(name)
            if self.groups[name].size_of(lanes) == 1 or not self.holds(name) or self._flag(name, "fsdp") != sharded:
                continue
            if sharded:
                # Called outside the module's forward: the LM's embedding and head, the Out path (by MimoModel), an
                # encoder on its own ranks (by the pipeline's EncoderStage).
                out_path = ("decode",) if name in model.output_token_ids else ()
                entry = ("embed", "logits", "head_loss") if name == LANGUAGE else ("encode_project", *out_path)
                # An untied embedding and head are each used once a forward: their own units free them between
                # that use and its backward (a tied one sits in the root unit, used at both ends).
                untied = name == LANGUAGE and not self.cfg.model.llm.tie_embeddings
                own = ("embed_tokens", "lm_head") if untied else ()
                mesh = self.groups[name].device_mesh(lanes)
                experts = name == LANGUAGE and self.ep > 1
                inner = expert_fsdp_units(module, mesh, self.expert_groups[1]) if experts else []
                apply_fsdp(module, mesh, entry_methods=entry, own_units=own, own_entry_methods=("weight_loss",),
                           inner_units=inner,
                           mp_policy=BF16_COMPUTE if self.cfg.precision.master_weights else None)
            elif name == LANGUAGE and self.ep > 1:
                experts = expert_params(module)
                ids = {id(p) for p in experts}
                self.reducers[name] = GradReducer(module, self.groups[name].group(lanes),
                                                  params=[p for p in module.parameters() if id(p) not in ids])
                self.reducers[f"{name}.experts"] = GradReducer(module, self.expert_groups[1], params=experts)
            else:
                # The Out path's weights (on a pipelined LM's last stage) are the pipeline's to reduce.
                out_path = {id(p) for p in self.pipeline.out_path_params(model)} if self.pipeline is not None else set()
                self.reducers[name] = GradReducer(module, self.groups[name].group(lanes),
                                                  params=[p for p in module.parameters() if id(p) not in out_path])

    def expert_mesh(self) -> DeviceMesh | None:
        """The mesh the LM's expert weights are sharded over (mimo.parallel.expert.layout.expert_mesh); None
        without expert parallelism or where this rank does not hold the LM. Not collective."""
        if self.expert_groups[0] is None:
            return None
        return expert_mesh(self.layout.grids[LANGUAGE], self.ep, self.rank, self.expert_groups,
                           self._flag(LANGUAGE, "fsdp"))

    def master_state_groups(self, name: str) -> list[tuple[list[nn.Parameter], ProcessGroup]]:
        """(parameters, group) of each GradReducer of module `name` (which sums them there first), the groups its
        fp32 master state is sharded over under precision.master_weights (ZeRO-1): on an expert-parallel LM dense
        parameters over all lanes, experts over their edp group; empty where it has one lane (not sharded)."""
        return [(r.params, r.group) for key, r in self.reducers.items() if key in (name, f"{name}.experts")]

    def fsdp_modules(self) -> list[str]:
        """The modules FSDP2 shards on this rank (fsdp = true and more than one data lane here)."""
        return [n for n in self.layout.grids if self._flag(n, "fsdp") and self.holds(n)
                and self.groups[n].size_of(self.data_dims(n)) > 1]

    def lm_tensor_parallel(self) -> tuple[ProcessGroup, bool] | None:
        """(TP group, sequence parallel) of the LM where this rank runs it with tp > 1, else None."""
        if self.layout.grids[LANGUAGE].tp == 1 or not self.holds(LANGUAGE):
            return None
        return self.groups[LANGUAGE].group("tp"), self._flag(LANGUAGE, "sequence_parallel")

    def finalize_grads(self, model: MimoModel) -> None:
        """Collective, once per step after the last backward: sequence-parallel partial gradients summed
        over TP, then replicated modules summed over their DP lanes (FSDP already reduced its shards)."""
        for name, module in modules_by_name(model).items():
            if self.layout.grids[name].tp > 1 and self.holds(name):
                sync_sequence_parallel_grads(module, self.groups[name].group("tp"))
        if self.pipeline is not None:
            self.pipeline.sync_tied_embeddings(model)
        for reducer in self.reducers.values():
            reducer.reduce()

    def gather_full(self, model: MimoModel, grads: bool = False) -> dict[str, torch.Tensor]:
        """Collective: every parameter (or its gradient) unsharded, FSDP first then TP; full on rank 0. For
        tests and diagnostics only: no part of a run gathers its model.

        Ranks other than 0 return an empty dict after taking part in the gathers. A missing gradient
        is gathered as zeros.
        """
        owners = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
        # Pipelined: every stage lead keeps its stage's tensors and rank 0 collects them from the leads.
        keep = self.rank == 0 if self.pipeline is None else self.pipeline.is_lead
        out = {}
        for pname, p in model.named_parameters():
            t = p.detach()
            if grads:
                t = p.grad if p.grad is not None else torch.zeros_like(p)
            t = t.full_tensor() if hasattr(t, "full_tensor") else t
            name = LANGUAGE if pname.startswith("language_model.") else pname.split(".")[1]
            dim = tp_shard_dim(owners[id(p)], pname)
            tp = self.layout.grids[name].tp
            if dim is not None and tp > 1:
                parts = [torch.empty_like(t) for _ in range(tp)]
                dist.all_gather(parts, t.contiguous(), group=self.groups[name].group("tp"))
                t = torch.cat(parts, dim=dim)
            if expert_slice(owners[id(p)], pname) is not None:
                parts = [torch.empty_like(t) for _ in range(self.ep)]
                dist.all_gather(parts, t.contiguous(), group=self.expert_groups[0])
                t = torch.cat(parts)
            if keep:
                out[pname] = t.clone()
        return out if self.pipeline is None else self.pipeline.gather_to_rank0(out)

    def decodes_in_place(self) -> bool:
        """Whether every rank can run greedy decoding on its sharded model in step with the others (LM sequence
        and context parallelism switched off by mimo.parallel.decoding): no pipeline and no bridge between data
        lanes of different widths (every rank decodes the same whole batch)."""
        return self.pipeline is None and all(b.direction == "equal" for b in self.bridges.values())

    def data_dims(self, name: str) -> str | tuple[str, ...]:
        """The dims over which a module's ranks hold different tokens: dp, and cp where the module has CP
        (its ranks then hold different positions of one sequence, so their gradients are partial sums)."""
        return ("cp", "dp") if self.layout.grids[name].cp > 1 else "dp"

    def batch_multiple(self) -> int:
        """Rows of a global batch must be a multiple of this (see `batch_multiple`)."""
        return batch_multiple(self.layout, self.cfg.parallel.microbatches)

    def data_lanes(self) -> int:
        """The finest data lanes of a microbatch: the lcm of the modules' DP degrees (each module's DP lane
        is a run of consecutive ones, see mimo.data.lanes)."""
        return math.lcm(*(g.dp for g in self.layout.grids.values()))

    def holds(self, name: str) -> bool:
        """Whether this rank runs (a stage of) module `name`; always true on colocated layouts."""
        return self.groups[name].member

    def dp_rank(self, name: str) -> int:
        return self.groups[name].rank_in("dp")

    def dp(self, name: str) -> int:
        return self.layout.grids[name].dp

    def install_bridges(self, model: MimoModel, runtime: ModelRuntime) -> ModelRuntime:
        """`runtime` with the colocated bridges whose data lanes differ (an equal one is the identity)."""
        bridges, output_bridges = dict(runtime.bridges), dict(runtime.output_bridges)
        for name, bridge in self.bridges.items():
            if bridge.direction != "equal":
                # The model's token ids, whose counts per sample the bridges take from the host (microbatch_rows).
                self.row_tokens[name] = {name: model.special_token_ids[name]}
                if name in model.output_token_ids:
                    self.row_tokens[name][out_key(name)] = model.output_token_ids[name]
                bridges[name] = bridge.to_language
                if name in model.output_token_ids:
                    output_bridges[name] = (bridge.to_encoder, bridge.to_language)
        return dataclasses.replace(runtime, bridges=bridges, output_bridges=output_bridges)

    def microbatches(self, batch: dict) -> list[dict]:
        """This rank's model inputs for each microbatch: text from the LM's DP lane, each modality's
        inputs from that modality's lane (see mimo.data.batching). Under context parallel the per-token
        entries then keep this rank's positions (`ContextParallel.shard_batch`). On a pipelined layout:
        what this rank's stage reads (`PipelinePlan.local_inputs`)."""
        if self.pipeline is not None:
            return self.pipeline.local_inputs(batch)
        lanes = {name: (self.dp_rank(name), self.dp(name)) for name in self.layout.grids}
        micro = split_microbatches(batch, self.cfg.parallel.microbatches, lanes)
        for mb, rows in zip(micro, self.microbatch_rows(batch)):
            if rows:
                mb["microbatch_rows"] = rows
        if self.context is not None:
            micro = [self.context.shard_batch(mb) for mb in micro]
        return micro

    def microbatch_rows(self, batch: dict) -> list[dict[str, list[int]]]:
        """Per microbatch of `batch`, for each modality whose colocated bridge moves rows: every sample's
        placeholders (and `out_key`: generation tokens) over the whole microbatch, host ints, the same on every
        rank (`StepHints.microbatch_rows`: the bridges then exchange no counts). Pure."""
        moving = [n for n, b in self.bridges.items() if b.direction != "equal" and n in self.row_tokens]
        ids = batch["input_ids"]
        per_mb = ids.shape[0] // self.cfg.parallel.microbatches
        out = []
        for t in range(self.cfg.parallel.microbatches):
            mb_ids = ids[t * per_mb: (t + 1) * per_mb]
            rows = {}
            for name in moving:
                for key, token in self.row_tokens[name].items():
                    rows[key] = (mb_ids == token).sum(1).tolist()
            out.append(rows)
        return out

    def agree_on_data(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """How the ranks that read data agree on a batch's per-row verdicts (elementwise maximum): among the
        readers on a pipelined layout; None (the data set's all-reduce over the world) where every rank reads."""
        return self.pipeline.agree_among_readers if self.pipeline is not None else None

    def barrier(self) -> None:
        """Collective: every rank waits here for the others; nothing to wait for on one process."""
        if self.world > 1:
            dist.barrier()

    def sum_lm_rows(self, t: torch.Tensor) -> torch.Tensor:
        """Collective: a per-rank statistic of the LM's rows (the MoE routers') summed over the ranks that hold
        different rows, each TP group counted once: over the LM's data lanes and CP ranks, on a pipelined layout
        over the world (`PipelinePlan.sum_per_lm_lane`); `t` itself on one process."""
        return self.pipeline.sum_per_lm_lane(t) if self.pipeline is not None else self.all_reduce_lm_data(t)

    def all_reduce_lm_lanes(self, t: torch.Tensor) -> torch.Tensor:
        """Collective over the LM's data lanes only: sums a per-lane quantity every TP and CP rank of a lane
        holds whole (the Out path's counts and decoder losses: rows decoded from the whole sequence)."""
        if self.groups[LANGUAGE].size_of("dp") > 1:
            dist.all_reduce(t, group=self.groups[LANGUAGE].group("dp"))
        return t

    def all_reduce_lm_data(self, t: torch.Tensor) -> torch.Tensor:
        """Collective over the LM's data lanes and CP ranks: sums a per-lane quantity (token counts, loss
        sums); CP ranks of one lane hold different label positions, so they add up too."""
        lanes = self.data_dims(LANGUAGE)
        if self.groups[LANGUAGE].size_of(lanes) > 1:
            dist.all_reduce(t, group=self.groups[LANGUAGE].group(lanes))
        return t
