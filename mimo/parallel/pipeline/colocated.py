"""Colocated layouts whose LM is pipelined: every encoder runs whole (its TP shard, pp = 1) on every rank, beside
the LM stage the rank holds (`colocated_pipeline`).

A step runs in three phases on every rank:

1. every modality's encoder forward for this rank's encoder data lane, microbatch after microbatch
   (`EncoderStage`, first and last stage at once), then one exchange hands each LM lane its samples' rows
   (mimo.parallel.bridge.colocated_pipelined);
2. the LM's 1F1B (or interleaved) schedule over its pp stages alone, its first stage reading the rows from
   that bridge;
3. one exchange hands each encoder lane its rows' gradients, then every encoder microbatch's backward.

With `perf.encoder_offload`, the named encoders' weights and optimizer states wait in host memory during phase 2
(mimo.parallel.pipeline.offload): moved out after phase 1's exchange, back before phase 3's.

The encoders' activations live across the LM's pipeline. `ColocatedPipelinePlan` is `PipelinePlan` with the
LM as the rank's pipelined module, these bridges, these phases and its own reads and split; finalisation,
gathers, tied embeddings and the step's report are `PipelinePlan`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from mimo.config.schema import LANGUAGE, Config
from mimo.data.batching import split_microbatches
from mimo.data.checks import check_batch
from mimo.models.flops import train_step_flops
from mimo.models.multimodal import MimoModel
from mimo.parallel.bridge.colocated_pipelined import ColocatedPipelineBridge
from mimo.parallel.data import REPLICAS
from mimo.parallel.grid import GridGroups
from mimo.parallel.layout import Layout
from mimo.parallel.p2p import Outbox
from mimo.parallel.pipeline.microbatches import encoder_microbatches
from mimo.parallel.pipeline.offload import HostOffload
from mimo.parallel.pipeline.plan import PipelinePlan
from mimo.parallel.pipeline.schedule import run_forwards
from mimo.parallel.pipeline.split import drop_parameters, only_encoder, out_path_parts, split_lm
from mimo.parallel.pipeline.stage import EncoderStage
from mimo.parallel.pipeline.step import StepResult, agree_on_input


class ColocatedPipelinePlan(PipelinePlan):
    """One rank's view of a colocated layout with a pipelined LM: its LM stage (`PipelinePlan`'s links, tied
    embeddings and report) and every encoder whole. Construct on every rank in the same order after the grids'
    groups (collective: the LM's links and embedding groups)."""

    def __init__(self, cfg: Config, layout: Layout, groups: dict[str, GridGroups], rank: int):
        super().__init__(cfg, layout, groups, rank)
        self.host = HostOffload()
        self.states: Callable[[str], list[torch.Tensor]] = lambda name: []

    def offload_states(self, states: Callable[[str], list[torch.Tensor]]) -> None:
        """`perf.encoder_offload` moves `states(name)`, module `name`'s optimizer state tensors on this rank, with
        the encoder's weights."""
        self.states = states

    def _stage_module(self, modules: tuple[str, ...]) -> str:
        return LANGUAGE

    def _encoder_depth(self) -> int:
        return 0  # the encoders run before and after the LM's pipeline, not as stages of it

    def _build_bridges(self) -> dict[str, ColocatedPipelineBridge]:
        """Each modality's bridge, told its rows' dtype (its autocast's: the projection's last linear gives it)
        and the LM embeddings' (bf16 under master weights)."""
        hidden, p = self.cfg.model.llm.hidden, self.cfg.precision
        embeddings = torch.bfloat16 if p.master_weights else torch.float32
        return {name: ColocatedPipelineBridge(name, self.layout.grids[name], self.layout.grids[LANGUAGE], self.rank,
                                              hidden, getattr(torch, p.autocast_of(name)), embeddings)
                for name in self.cfg.model.modalities}

    @property
    def needs_data(self) -> bool:
        """Every rank reads the batch: every rank runs the encoders."""
        return True

    def local_inputs(self, batch: dict) -> list[dict]:
        """Per microbatch: its whole text (each sample's placeholders place the rows) and each modality's inputs of
        this rank's encoder lane. Not collective."""
        lanes = {name: (self.module_groups[name].rank_in("dp"), self.layout.grids[name].dp)
                 for name in self.cfg.model.modalities}
        return split_microbatches(batch, self.cfg.parallel.microbatches, {LANGUAGE: (0, 1), **lanes})

    def split(self, model: MimoModel) -> None:
        """Cut the LM down to this rank's stage; every encoder stays whole; the Out path's output projections and
        decoders stay on the LM's last stage only, where the final states are (whole, one copy per TP and CP rank
        of each data lane). Not collective."""
        split_lm(model.language_model, self.pp_rank, self.grid.pp, self.chunks)
        for name in model.output_token_ids:
            for part in out_path_parts(model.modality_submodules[name]):
                if not self.decodes:
                    drop_parameters(part)
                for p in part.parameters():
                    setattr(p, REPLICAS, self.grid.tp * self.grid.cp)

    def train_step(self, model: MimoModel, batch: dict | None, device: torch.device,
                   autocast: Callable[[], AbstractContextManager], backward: bool = True,
                   problem: str | None = None) -> StepResult:
        """The three phases (module docstring) for the global `batch`, which every rank passes; collective.
        Contract as `PipelinePlan.train_step`."""
        if batch is None and problem is None:
            raise ValueError(f"rank {self.rank} runs every encoder and needs the batch")
        outbox = Outbox()
        kw = {"prev": self.prev, "next_": self.next, "outbox": outbox, "device": device, "autocast": autocast}
        text, inputs = self._read_all(model, batch, device, problem)
        hidden = model.language_model.cfg.hidden
        encoders = []
        for name, bridge in self.bridges.items():
            sub = model.modality_submodules[name]
            bridge.begin(self._sample_rows(model, batch, name))
            encoders.append(EncoderStage(sub, only_encoder(sub, name)[0], True, True, bridge, inputs[name], hidden,
                                         **{**kw, "prev": None, "next_": None}))
        m = self.cfg.parallel.microbatches
        for stage in encoders:
            run_forwards(stage, m)
        for bridge in self.bridges.values():
            bridge.exchange_forward(device)
        self._offload(model, backward)
        lm, local_tokens, tokens = self._lm_step_stage(model, text, device, backward, kw)
        self._run_schedule(lm, backward)
        self.host.back()
        if backward:
            for bridge in self.bridges.values():
                bridge.exchange_backward(device)
            for stage in encoders:
                for _ in range(m):
                    stage.backward()
        outbox.drain()
        flops = train_step_flops(self.cfg.model, batch) if self.first and self.is_lead else 0
        return self._report(lm, local_tokens, tokens, flops, device)

    def _offload(self, model: MimoModel, backward: bool) -> None:
        """Where the step has a backward: the weights of `perf.encoder_offload`'s encoders and input projections
        and their modules' optimizer states to the host, except storage that the LM phase reads. Not collective."""
        names = self.cfg.perf.encoder_offload
        if not names or not backward:
            return
        subs = [model.modality_submodules[n] for n in names]
        moved = [p for sub in subs for part in (sub.encoders, sub.input_projections) for p in part.parameters()]
        ids = {id(p) for p in moved}
        self.host.out(moved + [t for n in names for t in self.states(n)],
                      keep=[p for p in model.parameters() if id(p) not in ids])

    def _sample_rows(self, model: MimoModel, batch: dict, name: str) -> list[list[int]]:
        """Per microbatch of `batch`, each sample's rows of modality `name`: its placeholders, on the host."""
        ids = batch["input_ids"]
        per_mb = ids.shape[0] // self.cfg.parallel.microbatches
        counts = (ids == model.special_token_ids[name]).sum(1).tolist()
        return [counts[t: t + per_mb] for t in range(0, ids.shape[0], per_mb)]

    def _read_all(self, model: MimoModel, batch: dict | None, device: torch.device,
                  problem: str | None) -> tuple[list | None, dict[str, list]]:
        """(the LM lane's text microbatches where this rank's stage reads them, each modality's encoder-lane
        inputs), once every rank agreed the batch is usable; collective (`agree_on_input`)."""
        m = self.cfg.parallel.microbatches
        text, inputs = None, {}
        try:
            if problem is None:
                check_batch(model, batch, list(self.bridges))
                if self.first or self.last:
                    text = self._lm_text(model, batch, device)
                for name in self.bridges:
                    encoder, _ = only_encoder(model.modality_submodules[name], name)
                    groups = self.module_groups[name]
                    inputs[name] = encoder_microbatches(batch, name, encoder, m, groups.rank_in("dp"),
                                                        self.layout.grids[name].dp)
        except ValueError as e:
            problem = str(e)
        agree_on_input(None if problem is None else f"rank {self.rank}: {problem}", device)
        return text, inputs
