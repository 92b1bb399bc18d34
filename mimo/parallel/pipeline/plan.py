"""Pipeline layouts: modules on disjoint ranks, each cut into pipeline stages, driven by 1F1B.

A layout is pipelined when its module grids are disjoint (SPEC 2.2), or when it has one module with pp > 1.
Then every rank runs exactly one stage of one module (under interleaved 1F1B, an LM rank's stage is its
`virtual_stages` model chunks). `PipelinePlan` is that rank's view: its stage, its links to the neighbouring
stages, the bridges from each encoder to the LM, the LM's tied-embedding group; it cuts the model down to the
stage (`split`; the Out path's decoders go to the LM's last stage, where the final states are) and runs a
training step's forward and backward passes (`train_step`). Everything after the backward (sequence-parallel
and DP gradient reductions, the global norm, the optimizer) is the same as for colocated layouts. A colocated
layout whose LM has pp > 1 is pipelined too, each rank running every encoder beside its LM stage:
`ColocatedPipelinePlan` (colocated.py) extends this class.

Pieces: rules (`is_pipelined`, `validate_pipeline`: what the gate checks; `data_readers`), split (what a stage
holds), microbatches (what a stage reads), stage (what a stage computes and sends), schedule (the 1F1B order),
step (`StepResult`, `agree_on_input`); beside them parallel/bridge/pipelined.py (encoder -> LM) and
parallel/p2p.py (messages).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor

from mimo.config.schema import LANGUAGE, Config
from mimo.data.batching import split_microbatches, to_device, with_loss_rows
from mimo.data.checks import check_batch, check_vocabulary
from mimo.models.flops import train_step_flops
from mimo.models.loss import loss_weights
from mimo.models.multimodal import MimoModel, modules_by_name
from mimo.models.out_loss import OutPathLoss
from mimo.parallel.bridge.pipelined import PipelineBridge
from mimo.parallel.context import ContextParallel
from mimo.parallel.data import GradReducer
from mimo.parallel.grid import Grid, GridGroups, member_group, pair_groups
from mimo.parallel.layout import Layout
from mimo.parallel.p2p import Outbox
from mimo.parallel.pipeline.microbatches import encoder_microbatches, lm_microbatches
from mimo.parallel.pipeline.rules import data_readers
from mimo.parallel.pipeline.schedule import (
    feeder_lead,
    interleaved_order,
    run_1f1b,
    run_forwards,
    run_interleaved,
    stage_index,
    warmup_microbatches,
)
from mimo.parallel.pipeline.split import (
    chunk_layers,
    drop_parameters,
    keep_out_path,
    only_encoder,
    out_path_parts,
    split_encoder,
    split_lm,
)
from mimo.parallel.pipeline.stage import ChunkStages, EncoderStage, LMStage, StageLink
from mimo.parallel.pipeline.step import StepResult, agree_on_input
from mimo.parallel.pipeline.virtual import virtual_stages
from mimo.parallel.tensor import sequence_parallel_rows


def _stage_pairs(grid: Grid) -> list[tuple[int, int]]:
    """(rank, same position one stage later) for every stage boundary of `grid`."""
    size = grid.size // grid.pp
    return [(r, r + size) for r in range(grid.offset, grid.end - size)]


class PipelinePlan:
    """One rank's stage of a pipelined layout. Construct on every rank in the same order after the
    grids' groups: it creates the link, bridge and embedding groups (collective)."""

    def __init__(self, cfg: Config, layout: Layout, groups: dict[str, GridGroups], rank: int):
        self.cfg, self.layout, self.rank = cfg, layout, rank
        role = layout.role(rank)
        self.module = self._stage_module(role.modules)
        self.grid, self.groups, self.module_groups = layout.grids[self.module], groups[self.module], groups
        self.pp_rank = self.grid.coords(rank)["pp"]
        self.first, self.last = role.stages[self.module].first, role.stages[self.module].last
        depth = self._encoder_depth()
        self.total_stages = depth + layout.grids[LANGUAGE].pp
        self.stage = stage_index(self.pp_rank, self.module == LANGUAGE, depth)
        self.depth = depth
        # Interleaved 1F1B: the LM's model chunks per rank; chunk k > 0 of the first stage takes its input
        # from chunk k - 1 of the last stage (the wrap links, None unless chunks > 1).
        self.chunks = virtual_stages(cfg, LANGUAGE)
        self.prev, self.next = self._build_links(self._pairs())
        self.wrap_prev, self.wrap_next = self._build_links(self._wrap_pairs())
        self.bridges = self._build_bridges()
        self.embedding_group = self._build_embedding_group()
        self.reader_group, _ = member_group([data_readers(layout)])
        # The LM's context parallel (set by ParallelPlan on LM ranks when cp > 1): cuts the text microbatches.
        self.context: ContextParallel | None = None
        # The Out path's terms of the objective, computed on the LM's last stage (`decodes`).
        self.out_loss = OutPathLoss(cfg.model)

    def _stage_module(self, modules: tuple[str, ...]) -> str:
        """The module whose stage this rank runs: its only one."""
        (module,) = modules
        return module

    def _encoder_depth(self) -> int:
        """Stages the encoders add before the LM's first: the deepest encoder pipeline."""
        return max((g.pp for n, g in self.layout.grids.items() if n != LANGUAGE), default=0)

    def _build_bridges(self) -> dict[str, PipelineBridge]:
        """Collective: each modality's pipeline bridge (its leaders' pair groups)."""
        per_mb = self.cfg.data.global_batch // self.cfg.parallel.microbatches
        bridges = {}
        for name in self.cfg.model.modalities:
            boundary = (self.module == name and self.last) or (self.module == LANGUAGE and self.first)
            # The LM's first stage serves the rows to its lane's TP and CP ranks (each builds the whole sequence).
            replicas = ("tp", "cp") if self.module == LANGUAGE else "tp"
            bridges[name] = PipelineBridge(name, self.layout.grids[name], self.layout.grids[LANGUAGE], per_mb,
                                           self.rank, self.groups.group(replicas) if boundary else None)
        return bridges

    def _pairs(self) -> list[tuple[int, int]]:
        return [p for g in self.layout.grids.values() for p in _stage_pairs(g)]

    def _wrap_pairs(self) -> list[tuple[int, int]]:
        """(last-stage LM rank, its first-stage twin) for every LM lane, when the LM is interleaved."""
        lm = self.layout.grids[LANGUAGE]
        if self.chunks == 1:
            return []
        span = lm.size // lm.pp * (lm.pp - 1)
        return [(r + span, r) for r in range(lm.offset, lm.offset + lm.size // lm.pp)]

    def _build_links(self, pairs: list[tuple[int, int]]) -> tuple[StageLink | None, StageLink | None]:
        """Collective: this rank's links along `pairs` (a group per pair and direction), as (prev, next)."""
        down = pair_groups(pairs)
        up = pair_groups([(b, a) for a, b in pairs])
        prev = nxt = None
        for a, b in pairs:
            if self.rank == a:
                nxt = StageLink(b, send_group=down[(a, b)], recv_group=up[(b, a)])
            elif self.rank == b:
                prev = StageLink(a, send_group=up[(b, a)], recv_group=down[(a, b)])
        return prev, nxt

    def _build_embedding_group(self) -> ProcessGroup | None:
        """Collective: each first-stage LM rank paired with its last-stage twin (tied embeddings only)."""
        lm = self.layout.grids[LANGUAGE]
        if lm.pp == 1 or not self.cfg.model.llm.tie_embeddings:
            return None
        span = lm.size // lm.pp * (lm.pp - 1)
        groups = pair_groups([(r, r + span) for r in range(lm.offset, lm.offset + lm.size // lm.pp)])
        return next(iter(groups.values()), None)

    @property
    def needs_data(self) -> bool:
        """Whether this rank reads the batch: encoder first stages, LM first and last stages."""
        return self.first or (self.module == LANGUAGE and self.last)

    def agree_among_readers(self, verdicts: torch.Tensor) -> torch.Tensor:
        """Collective over the ranks that read data (`data_readers`): the elementwise maximum of `verdicts`,
        in place. A data set's per-row verdicts travel this way; the other ranks learn of a failed batch
        from `train_step`'s `agree_on_input`."""
        dist.all_reduce(verdicts, op=dist.ReduceOp.MAX, group=self.reader_group)
        return verdicts

    def local_inputs(self, batch: dict) -> list[dict]:
        """What this rank reads of `batch`, per microbatch, shaped like mimo.data.batching's microbatches:
        the LM lane's text on the LM's first and last stages, the encoder lane's inputs (and no text) on an
        encoder's first stage, nothing elsewhere. Not collective."""
        m, lane, dp = self.cfg.parallel.microbatches, self.groups.rank_in("dp"), self.grid.dp
        if self.module == LANGUAGE:
            return lm_microbatches(batch, m, lane, dp) if self.needs_data else []
        if not self.first:
            return []
        return [{"input_ids": mb["input_ids"][:0], "modality_inputs": mb["modality_inputs"]}
                for mb in split_microbatches(batch, m, {self.module: (lane, dp)})]

    @property
    def is_lead(self) -> bool:
        """TP, CP and DP rank 0 of its stage: the rank that speaks for the stage's weights."""
        return self.groups.rank_in(("tp", "cp", "dp")) == 0

    @property
    def decodes(self) -> bool:
        """Whether this rank runs the Out path: the LM's last stage, where the final states are."""
        return self.module == LANGUAGE and self.last

    def split(self, model: MimoModel) -> None:
        """Cut the (tensor-parallelised) full model down to this rank's stage, the Out path's output
        projections and decoders to the LM's last stage (`keep_out_path`). Not collective."""
        for name, module in modules_by_name(model).items():
            if name == self.module == LANGUAGE:
                split_lm(module, self.pp_rank, self.grid.pp, self.chunks)
            elif name == self.module:
                split_encoder(module, name, self.pp_rank, self.grid.pp)
                for part in out_path_parts(module):
                    drop_parameters(part)
            elif self.decodes and name in model.output_token_ids:
                keep_out_path(module, self.grid.tp * self.grid.cp)
            else:
                drop_parameters(module)

    def out_path_reducers(self, model: MimoModel) -> dict[str, GradReducer]:
        """The reduction of the Out path's weights on the LM's last stage (`split`): their gradients summed
        over the stage's data lanes, not its CP ranks (each decodes the whole sequence); none elsewhere, or
        with one lane. Build after the model is materialised. Not collective."""
        params = self.out_path_params(model)
        if not self.decodes or self.groups.size_of("dp") == 1 or not params:
            return {}
        return {"out_path": GradReducer(model, self.groups.group("dp"), params=params)}

    def out_path_params(self, model: MimoModel) -> list[torch.nn.Parameter]:
        """The Out path's weights this rank holds (on the LM's last stage, `split`), which `out_path_reducers`
        reduces and no modality's reducer may. Not collective."""
        subs = [model.modality_submodules[n] for n in model.output_token_ids]
        return [p for sub in subs for part in out_path_parts(sub) for p in part.parameters()]

    def sync_tied_embeddings(self, model: MimoModel) -> None:
        """Collective on the LM's first and last stages: sum the two copies' gradients of a tied embedding.
        Under FSDP each copy is sharded over its stage's data lanes alike (the two ranks of a pair sit at
        the same dp position), so the pair sums its local shards."""
        if self.embedding_group is None:
            return
        w = model.language_model.embed_tokens.weight
        if not w.requires_grad:
            return
        grad = w.grad if w.grad is not None else torch.zeros_like(w)
        dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.embedding_group)
        w.grad = grad

    def gather_to_rank0(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Collective over the world: the tensors every rank passes (only stage leads pass any) merged on
        rank 0 (others get {})."""
        device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
        mine = {k: v.cpu() for k, v in tensors.items()}
        parts: list[dict] | None = [{} for _ in range(dist.get_world_size())] if self.rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        if self.rank != 0:
            return {}
        return {k: v.to(device) for part in parts for k, v in part.items()}

    def train_step(self, model: MimoModel, batch: dict | None, device: torch.device,
                   autocast: Callable[[], AbstractContextManager], backward: bool = True,
                   problem: str | None = None) -> StepResult:
        """Forward and backward of every microbatch through this rank's stage; collective.

        `batch` (the global batch) is needed where `needs_data`, else None. Afterwards gradients hold
        this stage's share of d(loss_sum / N_global + the Out path's terms, mimo.models.out_loss); call
        `ParallelPlan.finalize_grads` next. With
        `backward` false (evaluation; call it under torch.no_grad) every stage runs the microbatches'
        forwards only, in order, and the result is the same loss; gradients are untouched. `problem` is
        why a rank that reads data has no batch (the data set's BatchFailed): every rank raises it.
        """
        if self.needs_data and batch is None and problem is None:
            raise ValueError(f"rank {self.rank} runs a first or last stage of '{self.module}' and needs the batch")
        outbox = Outbox()
        kw = {"prev": self.prev, "next_": self.next, "outbox": outbox, "device": device, "autocast": autocast}
        local_tokens = torch.zeros((), device=device)
        tokens = 0
        encoder = None
        if self.module != LANGUAGE:
            sub = model.modality_submodules[self.module]
            encoder, _ = only_encoder(sub, self.module)
        text, inputs = self._read(model, batch, encoder, device, problem)
        if self.module == LANGUAGE:
            stage, local_tokens, tokens = self._lm_step_stage(model, text, device, backward, kw)
        else:
            stage = EncoderStage(sub, encoder, self.first, self.last, self.bridges[self.module] if self.last else None,
                                 inputs, model.language_model.cfg.hidden, **kw)
        self._run_schedule(stage, backward)
        outbox.drain()
        # The global batch's FLOPs, counted once: by the lead rank of the LM's first stage, which holds it.
        counts_flops = self.module == LANGUAGE and self.first and self.is_lead
        flops = train_step_flops(self.cfg.model, batch) if counts_flops else 0
        return self._report(stage, local_tokens, tokens, flops, device)

    def _lm_step_stage(self, model: MimoModel, text: list | None, device: torch.device, backward: bool,
                       kw: dict) -> tuple[LMStage | ChunkStages, torch.Tensor, int]:
        """(this rank's LM stage for the step, its loss tokens, its input tokens); on the last stage the loss
        tokens are summed over its data lanes (collective there, when `backward`) to scale the loss by 1/N_global."""
        local_tokens = torch.zeros((), device=device)
        tokens = 0
        if self.last:
            local_tokens = sum(loss_weights(mb["labels"], mb.get("loss_mask")).sum() for mb in text)
            self.out_loss.begin(text, self._sum_over_lanes, device)
        if self.first:
            tokens = sum(mb["input_ids"].numel() for mb in text)
        n_global = local_tokens.detach().clone()
        lanes = ("cp", "dp") if self.grid.cp > 1 else "dp"  # CP ranks hold different label positions
        if self.last and self.groups.size_of(lanes) > 1 and backward:
            dist.all_reduce(n_global, group=self.groups.group(lanes))
        return self._lm_stage(model, text, 1.0 / n_global.clamp_min(1.0), kw), local_tokens, tokens

    def _lm_stage(self, model: MimoModel, text: list | None, scale: torch.Tensor, kw: dict) -> LMStage | ChunkStages:
        """This rank's LM stage; under interleaving one `LMStage` per model chunk, linked along the chunk order
        (chunk k of rank r feeds chunk k of rank r + 1, the last rank's chunk k feeds the first rank's k + 1)."""
        if self.chunks == 1:
            return LMStage(model, self.first, self.last, self.bridges if self.first else {}, text, scale,
                           out_loss=self.out_loss if self.last else None, **kw)
        layers = chunk_layers(self.cfg.model.llm.layers, self.grid.pp, self.pp_rank, self.chunks)
        stages = []
        for k, keys in enumerate(layers):
            first, last = self.first and k == 0, self.last and k == self.chunks - 1
            prev = None if first else self.wrap_prev if self.first else self.prev
            nxt = None if last else self.wrap_next if self.last else self.next
            stages.append(LMStage(model, first, last, self.bridges if first else {}, text, scale,
                                  out_loss=self.out_loss if last else None, layers=keys,
                                  **{**kw, "prev": prev, "next_": nxt}))
        return ChunkStages(stages)

    def _run_schedule(self, stage: LMStage | EncoderStage | ChunkStages, backward: bool) -> None:
        """One step's order: interleaved 1F1B on an interleaved LM's ranks, else plain 1F1B, whose warm-up on an
        encoder before an interleaved LM follows that LM's first rank (`feeder_lead`); forwards only without
        `backward`."""
        m = self.cfg.parallel.microbatches
        if isinstance(stage, ChunkStages):
            order = interleaved_order(self.pp_rank, self.grid.pp, self.chunks, m)
            run_interleaved(stage, order if backward else [op for op in order if op[0] == "F"])
        elif not backward:
            run_forwards(stage, m)
        elif self.chunks > 1:  # an encoder stage feeding an interleaved LM
            lead = feeder_lead(interleaved_order(0, self.layout.grids[LANGUAGE].pp, self.chunks, m))
            run_1f1b(stage, m, min(lead + self.depth - 1 - self.stage, m))
        else:
            run_1f1b(stage, m, warmup_microbatches(self.total_stages, self.stage, m))

    def _read(self, model: MimoModel, batch: dict | None, encoder: str | None, device: torch.device,
              problem: str | None) -> tuple[list | None, list | None]:
        """(LM text microbatches, encoder input microbatches) this stage reads of `batch`, once every rank
        agreed the batch is usable; collective (`agree_on_input`). Only stages that read the batch can find
        it bad, or (`problem`) have none."""
        m, lane, dp = self.cfg.parallel.microbatches, self.groups.rank_in("dp"), self.grid.dp
        text = inputs = None
        try:
            if problem is None and self.module == LANGUAGE and self.needs_data:
                text = self._lm_text(model, batch, device)
            elif problem is None and self.module != LANGUAGE and self.first:
                check_batch(model, batch, [self.module])
                inputs = encoder_microbatches(batch, self.module, encoder, m, lane, dp)
        except ValueError as e:
            problem = str(e)
        agree_on_input(None if problem is None else f"rank {self.rank} ({self.module} stage {self.pp_rank}): {problem}",
                       device)
        return text, inputs

    def _lm_text(self, model: MimoModel, batch: dict, device: torch.device) -> list[dict]:
        """The LM lane's text microbatches of `batch` on `device` (under CP this rank's positions; under
        perf.loss_rows_only the last stage's labelled rows). Raises ValueError on ids outside the vocabulary."""
        m, lane, dp = self.cfg.parallel.microbatches, self.groups.rank_in("dp"), self.grid.dp
        check_vocabulary(model, batch)
        text = lm_microbatches(batch, m, lane, dp)
        if self.context is not None:
            text = [self.context.shard_batch(mb) for mb in text]
        if self.last and self.cfg.perf.loss_rows_only:  # the labelled rows of this rank, on the host
            text = [with_loss_rows(mb) for mb in text]
            module = self.cfg.parallel.modules.get(LANGUAGE)
            if self.grid.tp > 1 and module is not None and module.sequence_parallel:  # of this TP shard
                tp_rank = self.groups.rank_in("tp")
                text = [sequence_parallel_rows(mb, self.grid.tp, tp_rank) for mb in text]
        return [to_device(mb, device) for mb in text]

    def sum_per_lm_lane(self, t: torch.Tensor) -> torch.Tensor:
        """Collective over the world: `t` summed over the LM's ranks, each LM lane's TP ranks counted once (other
        modules' ranks add zeros): per-stage values (the MoE layers' router statistics) reach every rank."""
        counted = self.module == LANGUAGE and self.groups.rank_in("tp") == 0
        out = t.clone() if counted else torch.zeros_like(t)
        dist.all_reduce(out)
        return out

    def _sum_over_lanes(self, t: torch.Tensor) -> torch.Tensor:
        """Collective over this LM stage's data lanes (not its CP ranks): the Out path's per-lane counts."""
        if self.groups.size_of("dp") > 1:
            dist.all_reduce(t, group=self.groups.group("dp"))
        return t

    def _report(self, stage: LMStage | EncoderStage, local_tokens: torch.Tensor, tokens: int, flops: int,
                device: torch.device) -> StepResult:
        """Collective over the world: loss sum, loss tokens and input tokens, counted once per LM lane (the
        first two summed over its CP ranks); the step's FLOPs, counted once; the Out path's decoder loss sums
        (once per lane: every CP rank decodes the whole sequence) and global output-token counts (once)."""
        k = len(self.out_loss.ids)
        report = torch.zeros(4 + 2 * k, dtype=torch.float64, device=device)
        if self.module == LANGUAGE and self.groups.rank_in("tp") == 0:
            if self.last:  # each CP rank's share of the lane's loss positions
                report[0], report[1] = stage.loss_sum.double(), local_tokens.double()
            if self.groups.rank_in("cp") == 0:  # every CP rank holds the lane's whole input ids
                report[2] = tokens
                if self.last and k:
                    report[4: 4 + k] = self.out_loss.sums.double()
                    if self.groups.rank_in("dp") == 0:  # begin's counts are already global
                        report[4 + k:] = self.out_loss.counts.double()
        report[3] = flops
        dist.all_reduce(report)
        loss_sum, n, total, flops = report[:4].tolist()
        out_objective, out_losses = self.out_loss.summary(report[4: 4 + k], report[4 + k:]) if k else (0.0, {})
        return StepResult(loss=loss_sum / max(n, 1.0), loss_tokens=int(n), tokens=int(total), flops=int(flops),
                          out_objective=out_objective, out_losses=out_losses)
