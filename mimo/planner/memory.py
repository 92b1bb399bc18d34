"""Peak memory per GPU of a layout, estimated from the config alone (what `mimo plan` ranks layouts by).

An estimate, not a measurement; it is simple on purpose so its numbers can be checked by hand:

- **Model states**, 16 bytes per trainable parameter: the trainer keeps fp32 weights, fp32 gradients
  and AdamW's two fp32 moments (bf16 autocast computes in bf16 but stores fp32). A frozen parameter
  costs its 4-byte weight only. Tensor parallelism divides a module's *sharded* parameters by tp:
  every >= 2-D weight of a transformer layer, and the LM's embedding and head (vocabulary-parallel);
  1-D weights (norms, biases), position/patch embeddings and projectors count whole on every TP rank.
  Pipeline parallelism gives each stage its own share of the layers, as the trainer splits them (earlier
  stages the smaller share); the LM's first stage also holds the embedding and its last the head (a tied
  head is the embedding, counted once where one GPU holds both), and the largest stage is reported.
  A Hugging Face model (`hf_path`) is sized with the shapes of its config.json. FSDP divides all of a module's
  states by its dp (dp x cp for the LM: FSDP shards over both). With `precision.master_weights` a module without
  FSDP keeps 4 bytes (bf16 weight and gradient) on every rank and 12 (fp32 master weight, two moments)
  split ZeRO-1 over its dp x cp lanes.
- **Mixture of experts**: the routed experts' stacked weights (`w_gate`, `w_up`, `w_down`) are not split by
  tp (mimo.parallel.tensor runs the MoE feed-forward TP-replicated; its router and shared expert count as
  replicated weights too) but by the LM's ep: each rank of an ep group holds E / ep experts, so 1/ep of the
  expert bytes. FSDP shards those over their edp group of dp x cp / ep ranks, which comes to 1/(dp x cp) of
  all experts as without ep; with `precision.master_weights` a replicated LM keeps the experts' 4 bytes / ep and
  their 12 / (dp x cp) (ZeRO-1 over the edp group of its 1/ep).
- **Activations** held for the backward, per microbatch, no recompute: per transformer layer about
  tokens x hidden x 34 bytes in bf16 (Megatron's estimate with flash attention: no s^2 score term);
  under tensor parallelism (10 + 24/tp) instead of 34, or 34/tp with sequence parallel. Twice that in
  float32 (the module's dtype: precision.module_dtype, else precision.dtype). The LM's tokens per microbatch
  per lane are global_batch / (microbatches x LM dp) x seq_len / cp, with seq_len the rows the data produces
  (the gate's `row_length`: a demo task's own length, else data.seq_len; data.pack_length when packing).
  An encoder's are samples per encoder lane x data.images_per_sample x its tokens per input: a ViT's
  patches (+ class token); for an audio encoder its max_positions, the most rows a clip can give (a
  rough upper bound).
  The LM head adds its fp32 logits and their gradient: tokens x vocab x 8 bytes / tp.
- **Activation checkpointing** (`perf.activation_checkpointing` names the module): each layer keeps
  only its input, tokens x hidden x 4 bytes (the residual stream stays fp32 under autocast), /tp with
  sequence parallel, per microbatch in flight; plus one layer's full activations (above), once, while
  the backward recomputes it.
- **Pipelined layouts** (1F1B): the stage at position i of s stages holds min(s - i, microbatches)
  microbatches of activations in flight (the first stage the most); every stage is costed and the worst
  GPU is reported. An interleaved LM (virtual_stages = v > 1) holds, on each rank, the peak count of model
  chunks' forwards awaiting their backward in the runtime's own `interleaved_order` (`interleaved_in_flight`;
  rank r of pp: 2 (pp - r - 1) + (v - 1) pp + 1 of them, at most v m), each 1/v of the rank's layers; an
  encoder stage before it, its warm-up (`feeder_lead`) plus one. Colocated layouts hold one microbatch at a
  time (gradient accumulation) and add up every module on each GPU.
- **Colocated layouts whose LM is pipelined** run every encoder's forward of every microbatch, then the LM's
  pipeline (no encoder stage in front: the LM's stage i of pp holds min(pp - i, microbatches) microbatches), then
  the encoders' backwards. Each LM stage's GPU is costed at two moments, the worse reported: inside the LM's
  pipeline (the encoders' activations of all microbatches held across it, their gradients not yet made: the
  optimizer step frees them) and at the encoders' first backward (the LM's activations gone, the encoders'
  gradients being made). `perf.encoder_offload` moves the rest of a named encoder's states, its weights and
  optimizer states, to the host for the pipeline. The rows cross in bf16 (float32 where neither the encoder's
  dtype nor master weights is bf16): the LM's first stage holds its lane's rows of the step (or their gradients)
  across its pipeline, every GPU its encoder lane's rows' gradients at the encoders' backward.
- A fixed **2 GiB** for the CUDA context, the NCCL buffers and the allocator's workspace.
- **Host memory of a CPU run** (`host_estimate`, per phase, checked against benchmarks/bench_memory.py in
  BENCHMARKS.md): the model is built on the meta device, so while it is built a rank holds only its own
  weights plus one full tensor being drawn (mimo.models.init); training adds gradients, moments and, under
  FSDP, the units it gathers; `mimo export` streams one tensor at a time. A fixed share for the interpreter.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch

from mimo.config.schema import LANGUAGE, Config, ModuleLayoutConfig
from mimo.hf.build import resolve_hf_architecture
from mimo.models.build import build_model
from mimo.models.moe import MoEFeedForward
from mimo.models.multimodal import BLOCK_STACKS
from mimo.parallel.expert.layout import EXPERT_WEIGHTS
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout
from mimo.parallel.pipeline.rules import colocated_pipeline, is_pipelined
from mimo.parallel.pipeline.schedule import feeder_lead, interleaved_order
from mimo.parallel.pipeline.split import stage_layers
from mimo.parallel.pipeline.virtual import virtual_stages
from mimo.planner.cost import encoder_rows, inputs_per_sample
from mimo.train.gate import row_length

GIB = 1024**3
FIXED_BYTES = 2 * GIB
"""CUDA context, NCCL buffers and allocator workspace, per GPU."""
STATE_BYTES, FROZEN_BYTES = 16, 4
"""fp32 weight + grad + two AdamW moments; a frozen parameter keeps its weight only."""
MASTER_WHOLE_BYTES, MASTER_SHARDED_BYTES = 4, 12
"""precision.master_weights: bf16 weight + bf16 grad on every rank; fp32 master + moments split over the data lanes."""
ACT_BYTES_PER_TOKEN_HIDDEN = 34
"""Megatron's per-layer activation bytes per token per hidden unit, bf16, flash attention."""
LOGIT_BYTES = 8
"""fp32 logits and their gradient, per token per vocabulary entry."""
RESIDUAL_BYTES = 4
"""A checkpointed layer's saved input, per token per hidden unit: the residual stream is fp32."""

_LAYER = re.compile(rf"^(language_model|modality_submodules\.[^.]+\.encoders\.[^.]+)\.({'|'.join(BLOCK_STACKS)})"
                    r"\.\d+\.")
"""A parameter of a transformer block (an FSDP unit of its own), of the LM or an encoder."""


@dataclass(frozen=True)
class ModuleSize:
    """One module's model-state bytes by how TP/PP split them, and its activation shape."""

    layers: int
    layer_sharded: float  # state bytes of all layers' >= 2-D weights (TP-split, PP-split)
    layer_replicated: float  # state bytes of all layers' 1-D weights (PP-split only)
    first: float  # LM embedding state bytes (first stage, TP-split); 0 for encoders
    last: float  # LM head state bytes (last stage, TP-split); 0 for encoders
    other: float  # everything else (norms, patch/position embeddings, projectors): whole on every rank
    params: int
    hidden: int
    tokens_per_sample: int  # LM: seq_len; encoder: inputs per sample x tokens per input
    vocab: int = 0  # LM only: the logits' width
    tied: bool = False  # LM only: the head is the embedding, one tensor on the first and the last stage
    experts: float = 0.0  # LM only: state bytes of all layers' routed experts (ep-split, PP-split, not TP-split)


@dataclass(frozen=True)
class Usage:
    """Estimated bytes on the worst GPU of a layout, by kind."""

    states: float
    activations: float

    @property
    def peak(self) -> float:
        return self.states + self.activations + FIXED_BYTES


def with_hf_shapes(cfg: Config) -> Config:
    """`cfg` with every `hf_path`'s architecture read from its config.json (the weights are not needed) and
    the paths cleared; `cfg` itself where none is set. Sizes and the trainer's checks need the real shapes."""
    if not (cfg.model.llm.hf_path or any(m.hf_path for m in cfg.model.modalities.values())):
        return cfg
    cfg = copy.deepcopy(cfg)
    resolve_hf_architecture(cfg.model)
    cfg.model.llm.hf_path = ""
    for m in cfg.model.modalities.values():
        m.hf_path = ""
    return cfg


def module_sizes(cfg: Config) -> dict[str, ModuleSize]:
    """Count every module's parameters exactly by building the model on the meta device (no memory)."""
    cfg = with_hf_shapes(cfg)
    with torch.device("meta"):
        model = build_model(cfg.model)
    moe = tuple(f"{n}." for n, m in model.named_modules() if isinstance(m, MoEFeedForward))
    buckets: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for pname, p in model.named_parameters():
        name = LANGUAGE if pname.startswith("language_model.") else pname.split(".")[1]
        b = buckets.setdefault(name, dict.fromkeys(("sharded", "replicated", "first", "last", "other", "experts"),
                                                   0.0))
        counts[name] = counts.get(name, 0) + p.numel()
        nbytes = p.numel() * (STATE_BYTES if p.requires_grad else FROZEN_BYTES)
        b[_bucket(pname, p.dim(), pname.startswith(moe))] += nbytes
    return {name: _size(cfg, name, b, counts[name]) for name, b in buckets.items()}


def _bucket(pname: str, dim: int, in_moe: bool) -> str:
    """Which split applies to a parameter, from its name and whether a MoE feed-forward holds it (see the
    module docstring)."""
    if in_moe:
        return "experts" if pname.rsplit(".", 1)[-1] in EXPERT_WEIGHTS else "replicated"
    if _LAYER.match(pname):
        return "sharded" if dim >= 2 else "replicated"
    if pname.startswith("language_model.embed_tokens."):
        return "first"
    if pname.startswith("language_model.lm_head."):
        return "last"
    return "other"


def _size(cfg: Config, name: str, b: dict[str, float], params: int) -> ModuleSize:
    """A ModuleSize from its byte buckets and the config's shapes."""
    if name == LANGUAGE:
        llm = cfg.model.llm
        seq = row_length(cfg, cfg.model) or (cfg.data.pack_length if cfg.data.packing else cfg.data.seq_len)
        return ModuleSize(llm.layers, b["sharded"], b["replicated"], b["first"], b["last"], b["other"], params,
                          llm.hidden, seq, llm.vocab, llm.tie_embeddings, b["experts"])
    m = cfg.model.modalities[name]
    if m.kind == "audio":
        layers, hidden, per_input = m.audio.layers, m.audio.hidden, m.audio.max_positions
    elif m.kind == "native_vision":  # the most patches an image of max_pixels gives
        layers, hidden, per_input = m.native.layers, m.native.hidden, m.native.max_pixels // m.native.patch ** 2
    else:
        v = m.vit
        layers, hidden = v.layers, v.hidden
        per_input = v.positions
    return ModuleSize(layers, b["sharded"], b["replicated"], 0.0, 0.0, b["other"], params, hidden,
                      cfg.data.images_per_sample * per_input)


def _layer_activation(tokens: float, hidden: int, tp: int, sp: bool, dtype: str) -> float:
    """Bytes one transformer layer keeps for the backward (Megatron's estimate, flash attention)."""
    per = ACT_BYTES_PER_TOKEN_HIDDEN / tp if sp else 10 + 24 / tp
    return tokens * hidden * per * (2 if dtype == "float32" else 1)


def stage_usage(cfg: Config, name: str, size: ModuleSize, grid: Grid, flags: ModuleLayoutConfig, stage: int,
                in_flight: float) -> Usage:
    """Bytes on one GPU of pipeline stage `stage` of module `name`, holding `in_flight` microbatches."""
    first, last = stage == 0, stage == grid.pp - 1
    layers = len(stage_layers(size.layers, grid.pp, stage)) if size.layers else 0
    share = layers / max(size.layers, 1)
    # a tied head is the embedding: one tensor, on the first stage and the last (once when they are one)
    sharded = share * size.layer_sharded + (first or (last and size.tied)) * size.first + last * size.last
    states = sharded / grid.tp + share * size.layer_replicated + size.other
    experts, ep, lanes = share * size.experts, flags.ep, grid.dp * grid.cp
    if flags.fsdp:  # the experts' 1/ep over their edp ranks: 1/lanes of them, as the rest
        states = (states + experts) / lanes
    elif cfg.precision.master_weights:  # bf16 weight and gradient whole, fp32 master and moments ZeRO-1 over the lanes
        states = (states * (MASTER_WHOLE_BYTES + MASTER_SHARDED_BYTES / lanes)
                  + experts * (MASTER_WHOLE_BYTES / ep + MASTER_SHARDED_BYTES / lanes)) / STATE_BYTES
    else:
        states += experts / ep
    samples = cfg.data.global_batch / (cfg.parallel.microbatches * grid.dp)
    tokens = samples * size.tokens_per_sample / grid.cp
    layer = _layer_activation(tokens, size.hidden, grid.tp, flags.sequence_parallel, cfg.precision.dtype_of(name))
    recompute = 0.0
    if name in cfg.perf.activation_checkpointing and layers:
        acts = layers * tokens * size.hidden * RESIDUAL_BYTES / (grid.tp if flags.sequence_parallel else 1)
        recompute = layer
    else:
        acts = layers * layer
    if last and size.vocab:
        acts += tokens * size.vocab * LOGIT_BYTES / grid.tp
    return Usage(states, acts * in_flight + recompute)


def estimate(cfg: Config, layout: Layout, sizes: dict[str, ModuleSize],
             modules: dict[str, ModuleLayoutConfig]) -> Usage:
    """The worst GPU's estimated bytes under `layout` (see the module docstring for the model)."""
    flags = {n: modules.get(n, ModuleLayoutConfig()) for n in layout.grids}
    if colocated_pipeline(layout):
        return _colocated_pipeline(cfg, layout, sizes, flags)
    if not is_pipelined(layout):
        parts = [stage_usage(cfg, n, sizes[n], g, flags[n], 0, 1) for n, g in layout.grids.items()]
        return Usage(sum(u.states for u in parts), sum(u.activations for u in parts))
    worst = Usage(0.0, 0.0)
    for name, grid in layout.grids.items():
        for stage in range(grid.pp):
            u = stage_usage(cfg, name, sizes[name], grid, flags[name], stage, in_flight(cfg, layout, name, stage))
            worst = max(worst, u, key=lambda x: x.peak)
    return worst


def _colocated_pipeline(cfg: Config, layout: Layout, sizes: dict[str, ModuleSize], flags: dict) -> Usage:
    """The worst LM stage's GPU of a colocated pipeline at the worse of its two moments (module docstring)."""
    micro, lm = cfg.parallel.microbatches, layout.grids[LANGUAGE]
    encoders = [n for n in layout.grids if n != LANGUAGE]
    held = {n: stage_usage(cfg, n, sizes[n], layout.grids[n], flags[n], 0, micro) for n in encoders}
    states = sum(held[n].states for n in encoders)
    kept = sum(0.0 if n in cfg.perf.encoder_offload else
               offloaded_bytes(cfg, held[n].states, layout.grids[n], flags[n]) for n in encoders)
    across = sum(held[n].activations for n in encoders)
    row = {n: inputs_per_sample(cfg, n) * encoder_rows(cfg, n) * cfg.model.llm.hidden * wire_bytes(cfg, n)
           for n in encoders}
    lane_rows = sum(cfg.data.global_batch / lm.dp * row[n] for n in encoders)
    backward = across + sum(cfg.data.global_batch / layout.grids[n].dp * row[n] for n in encoders)
    worst = Usage(0.0, 0.0)
    for stage in range(lm.pp):
        u = stage_usage(cfg, LANGUAGE, sizes[LANGUAGE], lm, flags[LANGUAGE], stage, in_flight(cfg, layout, LANGUAGE,
                                                                                               stage))
        pipeline = Usage(u.states + kept, u.activations + across + (lane_rows if stage == 0 else 0.0))
        after = Usage(u.states + states, backward)
        worst = max(worst, pipeline, after, key=lambda x: x.peak)
    return worst


def wire_bytes(cfg: Config, name: str) -> int:
    """Bytes a value of encoder `name`'s rows takes crossing to a pipelined LM on the same ranks: bf16 where the
    encoder computes in bf16 or the LM's embeddings are bf16 (master weights), else float32."""
    return 4 if cfg.precision.dtype_of(name) == "float32" and not cfg.precision.master_weights else 2


def gradient_bytes(cfg: Config, states: float, grid: Grid, flags: ModuleLayoutConfig) -> float:
    """The gradients' part of `states`, a module's state bytes on one GPU (as a trainable parameter's: 4 of
    16 bytes; 2 bf16 bytes of 4 + 12 / lanes with precision.master_weights and no FSDP)."""
    if cfg.precision.master_weights and not flags.fsdp:
        return states * 2 / (MASTER_WHOLE_BYTES + MASTER_SHARDED_BYTES / (grid.dp * grid.cp))
    return states * 4 / STATE_BYTES


def offloaded_bytes(cfg: Config, states: float, grid: Grid, flags: ModuleLayoutConfig) -> float:
    """Bytes an encoder offload moves to the host, each way: its weights and optimizer states on one GPU."""
    return states - gradient_bytes(cfg, states, grid, flags)


def in_flight(cfg: Config, layout: Layout, name: str, stage: int) -> float:
    """Microbatches of activations pipeline stage `stage` of module `name` holds at its peak, as the runtime
    schedules it (`PipelinePlan._run_schedule`): a plain 1F1B stage its warm-up plus one, at most the
    microbatches; an interleaved LM's rank its peak chunks in flight (`interleaved_in_flight`) over v."""
    m, lm, v = cfg.parallel.microbatches, layout.grids[LANGUAGE], virtual_stages(cfg, LANGUAGE)
    depth = 0 if layout.colocated else max((g.pp for n, g in layout.grids.items() if n != LANGUAGE), default=0)
    if v > 1 and name == LANGUAGE:
        return interleaved_in_flight(stage, lm.pp, v, m) / v
    if v > 1:  # an encoder stage feeding an interleaved LM
        return min(feeder_lead(interleaved_order(0, lm.pp, v, m)) + depth - stage, m)
    return min(depth + lm.pp - (depth if name == LANGUAGE else 0) - stage, m)


def interleaved_in_flight(rank: int, pp: int, chunks: int, microbatches: int) -> int:
    """The most model-chunk forwards rank `rank` of `pp` holds awaiting their backward under the runtime's
    `interleaved_order`: counted along that order, not from a formula."""
    held = peak = 0
    for kind, _, _ in interleaved_order(rank, pp, chunks, microbatches):
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


# Host memory of a CPU (gloo) run, phase by phase -----------------------------------------------------
HOST_FIXED_BYTES = 0.45 * GIB
"""The interpreter, torch and gloo on one process before the model (benchmarks/bench_memory.py's "start")."""
WEIGHT_BYTES = 4
"""A fp32 weight alone: all that exists while the model is built (no gradients or moments yet)."""


def largest_parameter_bytes(cfg: Config) -> int:
    """Bytes of the largest full fp32 parameter: what a rank allocates at once while it materialises its
    pieces (mimo.models.init) and what `mimo export` holds while it streams one tensor."""
    cfg = with_hf_shapes(cfg)
    with torch.device("meta"):
        model = build_model(cfg.model)
    return max(p.numel() for p in model.parameters()) * WEIGHT_BYTES


def _fsdp_gathered(cfg: Config, layout: Layout, sizes: dict[str, ModuleSize]) -> float:
    """Bytes FSDP2 holds unsharded at once on one rank during a step: the module's root unit (everything
    outside its layers, kept from forward to backward; a tied LM's embedding with it) and its largest other
    unit (one layer, or an untied LM's embedding or head, each its own unit), weights and gradients of each."""
    worst = 0.0
    for name, grid in layout.grids.items():
        module = cfg.parallel.modules.get(name)
        if module is None or not module.fsdp or grid.dp * grid.cp == 1:
            continue
        s = sizes[name]
        layer = (s.layer_sharded / grid.tp + s.layer_replicated + s.experts / module.ep) / max(s.layers, 1)
        root = s.first / grid.tp + s.other if s.tied else s.other
        unit = layer if s.tied else max(layer, s.first / grid.tp, s.last / grid.tp)
        worst = max(worst, (root + unit) * 2 * WEIGHT_BYTES / STATE_BYTES)
    return worst


def host_estimate(cfg: Config, layout: Layout) -> dict[str, float]:
    """Peak resident bytes of the worst rank of a CPU run of `layout`, by phase: "build" (the model built on
    meta and materialised: this rank's weights plus one full tensor), "train" (weights, gradients and AdamW
    moments of its share, activations, FSDP's gathered units) and "export" (one process streaming the
    checkpoint: about two copies of the largest tensor). Compared with the measured peaks in BENCHMARKS.md."""
    sizes = module_sizes(cfg)
    usage = estimate(cfg, layout, sizes, cfg.parallel.modules)
    largest = largest_parameter_bytes(cfg)
    return {"build": usage.states * WEIGHT_BYTES / STATE_BYTES + largest + HOST_FIXED_BYTES,
            "train": usage.states + usage.activations + _fsdp_gathered(cfg, layout, sizes) + HOST_FIXED_BYTES,
            "export": 2 * largest + HOST_FIXED_BYTES}
