"""Predicted step time of one layout: the pieces of mimo.planner.cost put on the schedule mimo runs.

- **Colocated layouts** (no pipeline): every GPU runs each module in turn, microbatch after microbatch
  (gradient accumulation): per microbatch the encoders' forward, the bridge, the LM's forward and
  backward, the bridge back, the encoders' backward. The colocated bridge all-gathers the LM lane's rows
  from its k encoder lanes in the forward (fan-in) or the encoder lane's gradient in the backward (fan-out).
- **Pipelined layouts**: the multi-module 1F1B of mimo.parallel.pipeline.schedule on the simulator's clock
  (mimo.planner.simulate), each stage's forward and backward per microbatch from its layers (the LM's head
  on its last stage), each boundary's message from the network model (the pipeline bridge's leader send plus
  its broadcast to the TP group). An interleaved LM (`parallel.modules.language.virtual_stages` = v > 1) runs
  the runtime's `interleaved_order` over its pp x v virtual stages instead: a bubble of about (pp - 1) / (v m)
  of the step rather than (pp - 1) / m, for v times the boundary messages.
- **Colocated layouts whose LM is pipelined**: three phases on the simulator's clock
  (`colocated_pipeline_ops`): on every GPU each encoder's forward of every microbatch; per modality one
  all-to-all over the world of the step's rows (`wire_bytes`; each encoder lane's first TP rank sends its rows to
  every TP and CP rank of the LM lanes' first stage that take them); the LM's pipeline alone (1F1B or
  interleaved, its pieces and sends as above); one all-to-all of the rows' gradients back (each LM lane's
  first-stage lead to every TP rank of the encoder lanes); each encoder's backward of every microbatch. With
  `perf.encoder_offload` the named encoders' weights and optimizer states (mimo.planner.memory.offloaded_bytes)
  go to the host after the first exchange and come back before the second, on the compute stream at the
  network's host bandwidth, each GPU on its own clock (a late LM stage copies during its idle cool-down).
- **Activation checkpointing** (`perf.activation_checkpointing`): a named module's blocks run their forward
  again in the backward, collectives included (its head, patch embedding and projector do not).
- **After the backward** (all): each module's gradients are all-reduced over its dp x cp group (an
  expert-parallel LM's experts, 1/ep of them per rank, over their edp group of dp x cp / ep ranks; bf16 with
  `precision.master_weights`, which also all-gathers the updated bf16 weights; fp32 otherwise). mimo runs the
  reduction after the whole backward, so it is exposed; `overlap_dp=True` models a reduction that hides
  under the last microbatch's backward. FSDP all-gathers each layer's weights in the forward and again in
  the backward and reduce-scatters its gradient, per microbatch, prefetched under the compute (only the
  excess shows, and at least the first layer's gather and the last layer's scatter, which nothing hides).
  Then the gradient norm (one read of the gradients) and AdamW (28 bytes per parameter of this rank's
  shard) at the profile's memory bandwidth; under a pipeline the slowest stage's tail counts.

MFU is the model FLOPs of mimo.models.flops (what `mimo train` reports) over step time x GPUs x
`metrics.peak_tflops`; tokens per second per GPU count every row token of the global batch, as the trainer does.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo.config.schema import LANGUAGE, Config, ModuleLayoutConfig
from mimo.models.flops import TRAIN_FACTOR, audio_flops, lm_flops, projector_flops, vit_flops
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout
from mimo.parallel.pipeline.rules import colocated_pipeline, is_pipelined
from mimo.parallel.pipeline.schedule import feeder_lead, interleaved_order, warmup_microbatches
from mimo.parallel.pipeline.split import stage_layers
from mimo.parallel.pipeline.virtual import virtual_stages
from mimo.planner.cost import (
    Piece,
    audio_frames,
    decoder_layer,
    encoder_edges,
    encoder_layer,
    encoder_rows,
    inputs_per_sample,
    lm_head,
    memory_s,
)
from mimo.planner.memory import (
    STATE_BYTES,
    ModuleSize,
    offloaded_bytes,
    stage_usage,
    wire_bytes,
)
from mimo.planner.network import Network
from mimo.planner.profile import Profile
from mimo.planner.simulate import (
    Op,
    colocated_pipeline_ops,
    interleaved_ops,
    one_f_one_b_ops,
    plain_ops,
    simulate,
)

ADAMW_BYTES = 28
"""AdamW's traffic per parameter: read weight, gradient and two moments, write weight and moments."""


@dataclass(frozen=True)
class Prediction:
    """One layout's predicted step: seconds in total and by part, rates, and the pipeline's bubble."""

    step_s: float
    compute_s: float
    comm_s: float
    reduce_s: float
    optimizer_s: float
    bubble_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float


@dataclass(frozen=True)
class Setting:
    """What a prediction needs besides the layout."""

    cfg: Config
    sizes: dict[str, ModuleSize]
    profile: Profile
    network: Network
    overlap_dp: bool = False


def model_flops(cfg: Config, seq: int) -> float:
    """Model FLOPs of one training step over the global batch (mimo.models.flops' formulas, average inputs)."""
    batch, lm_h = cfg.data.global_batch, cfg.model.llm.hidden
    forward = batch * lm_flops(cfg.model.llm, seq)
    for name, m in cfg.model.modalities.items():
        n = batch * inputs_per_sample(cfg, name)
        rows = n * encoder_rows(cfg, name)
        if m.kind == "audio":
            forward += n * audio_flops(m.audio, audio_frames(cfg, name)) + projector_flops(m.audio.hidden, lm_h, rows)
        else:
            forward += n * vit_flops(m.vit) + projector_flops(m.vit.hidden, lm_h, rows)
    return TRAIN_FACTOR * forward


def _text_rows(s: Setting, seq: int) -> float:
    """Loss rows of one sample: the row minus the placeholders its inputs fill."""
    filled = sum(inputs_per_sample(s.cfg, n) * encoder_rows(s.cfg, n) for n in s.cfg.model.modalities)
    return max(seq - filled, 1.0)


def module_piece(s: Setting, name: str, grid: Grid, flags: ModuleLayoutConfig, stage: int = 0,
                 chunks: int = 1) -> Piece:
    """One microbatch through stage `stage` of module `name` on one rank of `grid`; with `chunks` > 1 (an
    interleaved LM) `stage` is a virtual stage of pp x chunks (`split.chunk_layers`)."""
    cfg, size = s.cfg, s.sizes[name]
    samples = cfg.data.global_batch / (cfg.parallel.microbatches * grid.dp)
    layers = len(stage_layers(size.layers, grid.pp * chunks, stage))
    last = stage == grid.pp * chunks - 1
    if name == LANGUAGE:
        seq = size.tokens_per_sample
        held = [int(i) for i in stage_layers(size.layers, grid.pp * chunks, stage)]
        experts = sum(cfg.model.llm.is_moe_layer(i) for i in held)
        piece = _times(decoder_layer(cfg, s.profile, s.network, grid, flags, samples, seq), layers - experts)
        if experts:
            piece = piece + _times(decoder_layer(cfg, s.profile, s.network, grid, flags, samples, seq, moe=True),
                                   experts)
        piece = _recomputed(cfg, name, piece)
        return piece + lm_head(cfg, s.profile, s.network, grid, samples, seq, _text_rows(s, seq)) if last else piece
    inputs = samples * inputs_per_sample(cfg, name)
    piece = _recomputed(cfg, name, _times(encoder_layer(cfg, s.profile, s.network, name, grid, inputs), layers))
    return piece + encoder_edges(cfg, s.profile, name, inputs) if last else piece


def _recomputed(cfg: Config, name: str, layers: Piece) -> Piece:
    """`layers` (a module's blocks on one rank) with, where perf.activation_checkpointing names the module, their
    forward run again in the backward, its collectives included."""
    if name not in cfg.perf.activation_checkpointing:
        return layers
    return Piece(layers.forward_s, layers.backward_s + layers.forward_s, layers.forward_comm_s,
                 layers.backward_comm_s + layers.forward_comm_s)


def _times(p: Piece, n: int) -> Piece:
    return Piece(p.forward_s * n, p.backward_s * n, p.forward_comm_s * n, p.backward_comm_s * n)


def _bridge(s: Setting, name: str, enc: Grid, lm: Grid) -> Piece:
    """The colocated bridge of one microbatch: all-gathered rows (fan-in forward, fan-out backward)."""
    cfg = s.cfg
    rows = cfg.data.global_batch / (cfg.parallel.microbatches * min(enc.dp, lm.dp))
    nbytes = rows * inputs_per_sample(cfg, name) * encoder_rows(cfg, name) * cfg.model.llm.hidden * 2
    k = max(enc.dp, lm.dp) // min(enc.dp, lm.dp)
    t = s.network.all_gather(nbytes, enc.offset, enc.tp * enc.cp, k)
    return Piece(0.0, 0.0, t if enc.dp > lm.dp else 0.0, t if lm.dp > enc.dp else 0.0)


def _tail(s: Setting, name: str, grid: Grid, flags: ModuleLayoutConfig, stage: int, last_backward: float,
          compute: float) -> tuple[float, float]:
    """(exposed reduction, optimizer) seconds after the backward of one rank of stage `stage` of `name`."""
    cfg, net = s.cfg, s.network
    grad_bytes = 2 if cfg.precision.master_weights else 4
    exposed = replicated = held = shard = 0.0
    for params, stride, lanes in _reduce_groups(s, name, grid, flags, stage):
        held += params
        if flags.fsdp and lanes > 1:
            gathers = 2 * net.all_gather(params * 2, grid.offset, stride, lanes)
            scatter = net.reduce_scatter(params * 4, grid.offset, stride, lanes)
            edges = (gathers / 2 + scatter) / max(s.sizes[name].layers, 1)  # the first gather, the last scatter
            exposed += max(edges, (gathers + scatter) * cfg.parallel.microbatches - compute)
            shard += params / lanes
            continue
        reduce = net.all_reduce(params * grad_bytes, grid.offset, stride, lanes)
        if cfg.precision.master_weights and lanes > 1:
            reduce += net.all_gather(params * 2, grid.offset, stride, lanes)
        replicated += reduce
        shard += params / lanes if cfg.precision.master_weights else params
    exposed += max(0.0, replicated - last_backward) if s.overlap_dp else replicated
    return exposed, memory_s(s.profile, shard * ADAMW_BYTES + held * grad_bytes)


def _reduce_groups(s: Setting, name: str, grid: Grid, flags: ModuleLayoutConfig,
                   stage: int) -> list[tuple[float, int, int]]:
    """(parameters this rank holds, rank stride, ranks) of each group its gradients are reduced over: all but
    the routed experts over the dp x cp lanes (stride tp); an expert-parallel LM's experts, 1/ep of them here,
    over their edp group, taken as every ep-th lane (lanes / ep ranks, stride tp x ep)."""
    size = s.sizes[name]
    share = len(stage_layers(size.layers, grid.pp, stage)) / max(size.layers, 1)
    first, last = stage == 0, stage == grid.pp - 1
    states = (share * size.layer_sharded + first * size.first + last * size.last) / grid.tp
    dense = (states + share * size.layer_replicated + size.other) / STATE_BYTES
    lanes, ep = grid.dp * grid.cp, flags.ep
    groups = [(dense, grid.tp, lanes)]
    if size.experts:
        groups.append((share * size.experts / ep / STATE_BYTES, grid.tp * ep, lanes // ep))
    return groups


def predict(s: Setting, layout: Layout, modules: dict[str, ModuleLayoutConfig]) -> Prediction:
    """The predicted step of `layout` (see the module docstring)."""
    flags = {n: modules.get(n, ModuleLayoutConfig()) for n in layout.grids}
    if colocated_pipeline(layout):
        parts = _colocated_pipeline(s, layout, flags)
    elif is_pipelined(layout):
        parts = _pipelined(s, layout, flags)
    else:
        parts = _colocated(s, layout, flags)
    step = sum(parts)
    cfg, gpus = s.cfg, layout.world_size
    seq = s.sizes[LANGUAGE].tokens_per_sample
    tflops = model_flops(cfg, seq) / step / gpus / 1e12
    return Prediction(step, *parts, tokens_per_s_per_gpu=cfg.data.global_batch * seq / step / gpus,
                      model_tflops_per_gpu=tflops, mfu=tflops / cfg.metrics.peak_tflops)


def _colocated(s: Setting, layout: Layout, flags: dict) -> tuple[float, float, float, float, float]:
    """(compute, comm, reduce, optimizer, bubble) of a colocated layout."""
    lm = layout.grids[LANGUAGE]
    total = Piece(0.0, 0.0)
    pieces = {}
    for name, grid in layout.grids.items():
        pieces[name] = module_piece(s, name, grid, flags[name])
        total = total + pieces[name] + (_bridge(s, name, grid, lm) if name != LANGUAGE else Piece(0.0, 0.0))
    micro = s.cfg.parallel.microbatches
    reduce_s = optimizer_s = 0.0
    for name, grid in layout.grids.items():
        p = pieces[name]
        r, o = _tail(s, name, grid, flags[name], 0, p.backward, (p.forward_s + p.backward_s) * micro)
        reduce_s, optimizer_s = reduce_s + r, optimizer_s + o
    compute = (total.forward_s + total.backward_s) * micro
    comm = (total.forward_comm_s + total.backward_comm_s) * micro
    return compute, comm, reduce_s, optimizer_s, 0.0


def _pipelined(s: Setting, layout: Layout, flags: dict) -> tuple[float, float, float, float, float]:
    """(compute, comm, reduce, optimizer, bubble) of a pipelined layout, from the simulated schedule: plain
    1F1B, or with parallel.modules.language.virtual_stages = v > 1 the LM's pp x v virtual stages on the
    runtime's `interleaved_order` (a message across each of their pp x v - 1 boundaries, the last rank's
    wrapping to the first) and its encoders warmed up as `PipelinePlan` does (`feeder_lead`)."""
    micro, lm, v = s.cfg.parallel.microbatches, layout.grids[LANGUAGE], virtual_stages(s.cfg, LANGUAGE)
    depth = max((g.pp for n, g in layout.grids.items() if n != LANGUAGE), default=0)
    lead = feeder_lead(interleaved_order(0, lm.pp, v, micro)) if v > 1 else 0
    stages: list[tuple[str, int]] = []  # (module, module stage or LM virtual stage), one per vstage
    preds: dict[int, list[int]] = {}
    ends: list[int] = []
    ranks: list[list[Op]] = []  # one rank's ops, encoder stages first
    for name, grid in layout.grids.items():
        if name == LANGUAGE:
            continue
        for p in range(grid.pp):
            preds[len(stages)] = [len(stages) - 1] if p else []
            warmup = min(lead + depth - 1 - p, micro) if v > 1 else warmup_microbatches(depth + lm.pp, p, micro)
            ranks.append(plain_ops(len(stages), micro, warmup))
            stages.append((name, p))
        ends.append(len(stages) - 1)
    base = len(stages)
    for p in range(lm.pp * v):
        preds[len(stages)] = [len(stages) - 1] if p else ends
        stages.append((LANGUAGE, p))
    for r in range(lm.pp):
        ops = interleaved_ops(r, lm.pp, v, micro) if v > 1 else one_f_one_b_ops(depth + r, depth + lm.pp, micro)
        ranks.append([(k, t, base + (vs if v > 1 else r)) for k, t, vs in ops])
    chunks = {n: v if n == LANGUAGE else 1 for n in layout.grids}
    pieces = [module_piece(s, n, layout.grids[n], flags[n], p, chunks[n]) for n, p in stages]
    send = {i: _send_s(s, layout, n, p, chunks[n]) for i, (n, p) in enumerate(stages)}
    timeline = simulate(ranks, preds, {i: pc.forward for i, pc in enumerate(pieces)},
                        {i: pc.backward for i, pc in enumerate(pieces)}, send)
    held = [sorted({vs for _, _, vs in ops}) for ops in ranks]  # each rank's vstages
    tails = []
    for r, vs in enumerate(held):
        name = stages[vs[0]][0]
        stage = r - base if name == LANGUAGE else stages[vs[0]][1]
        tails.append(_tail(s, name, layout.grids[name], flags[name], stage, pieces[vs[0]].backward, 0.0))
    worst = max(range(len(ranks)), key=lambda r: sum(tails[r]))
    busiest = max(range(len(ranks)), key=lambda r: timeline.busy[r])
    compute = sum(pieces[vs].forward_s + pieces[vs].backward_s for vs in held[busiest]) * micro
    comm = timeline.busy[busiest] - compute
    return compute, comm, tails[worst][0], tails[worst][1], timeline.makespan - timeline.busy[busiest]


def _colocated_pipeline(s: Setting, layout: Layout, flags: dict) -> tuple[float, float, float, float, float]:
    """(compute, comm, reduce, optimizer, bubble) of a colocated layout whose LM is pipelined, from its simulated
    step (see the module docstring): one simulated GPU per LM stage (every GPU also runs every encoder's lane)."""
    micro, lm, v = s.cfg.parallel.microbatches, layout.grids[LANGUAGE], virtual_stages(s.cfg, LANGUAGE)
    vstages = lm.pp * v
    encoders = {n: module_piece(s, n, g, flags[n]) for n, g in layout.grids.items() if n != LANGUAGE}
    pieces = [module_piece(s, LANGUAGE, lm, flags[LANGUAGE], p, v) for p in range(vstages)]
    there, back = (sum(_rows_s(s, layout, n, way) for n in encoders) for way in (0, 1))
    host = _offload_s(s, layout, flags)
    ops, preds = colocated_pipeline_ops(lm.pp, v, micro, host > 0)
    forward = {i: pc.forward for i, pc in enumerate(pieces)} | {
        vstages + r: sum(p.forward for p in encoders.values()) for r in range(lm.pp)}
    backward = {i: pc.backward for i, pc in enumerate(pieces)} | {
        vstages + r: sum(p.backward for p in encoders.values()) for r in range(lm.pp)}
    send = {i: _send_s(s, layout, LANGUAGE, i, v) for i in range(vstages)}
    fixed = {("C", 0): there, ("C", 1): back, ("H", 0): host, ("H", 1): host}
    timeline = simulate(ops, preds, forward, backward, send, fixed)
    own = sum(p.forward_s + p.backward_s for p in encoders.values())
    enc_tails = [_tail(s, n, layout.grids[n], flags[n], 0, p.backward, (p.forward_s + p.backward_s) * micro)
                 for n, p in encoders.items()]
    tails = [tuple(map(sum, zip(*enc_tails, _tail(s, LANGUAGE, lm, flags[LANGUAGE], r, pieces[r].backward, 0.0))))
             for r in range(lm.pp)]
    worst = max(range(lm.pp), key=lambda r: sum(tails[r]))
    busiest = max(range(lm.pp), key=lambda r: timeline.busy[r])
    compute = (own + sum(pieces[c * lm.pp + busiest].forward_s + pieces[c * lm.pp + busiest].backward_s
                         for c in range(v))) * micro
    comm = timeline.busy[busiest] - compute
    return compute, comm, tails[worst][0], tails[worst][1], timeline.makespan - timeline.busy[busiest]


def _offload_s(s: Setting, layout: Layout, flags: dict) -> float:
    """One way of the encoders' offload (`perf.encoder_offload`) on one GPU: their weights and optimizer states
    over its host link."""
    nbytes = 0.0
    for name in s.cfg.perf.encoder_offload:
        grid = layout.grids[name]
        states = stage_usage(s.cfg, name, s.sizes[name], grid, flags[name], 0, 1).states
        nbytes += offloaded_bytes(s.cfg, states, grid, flags[name])
    return s.network.host_copy(nbytes)


def _rows_s(s: Setting, layout: Layout, name: str, way: int) -> float:
    """The all-to-all over the world of the step's rows of encoder `name` (`way` 0) or of their gradients
    (1), by its busiest rank: forward, an encoder lane's first TP rank sends its rows to each of the tp x cp
    first-stage ranks of its LM lane, each of which receives its lane's rows; backward, an LM lane's lead sends
    them to each of the encoder lane's tp ranks, each of which receives its lane's."""
    cfg, enc, lm = s.cfg, layout.grids[name], layout.grids[LANGUAGE]
    per_sample = inputs_per_sample(cfg, name) * encoder_rows(cfg, name) * cfg.model.llm.hidden * wire_bytes(cfg, name)
    enc_rows, lm_rows = (cfg.data.global_batch / dp * per_sample for dp in (enc.dp, lm.dp))
    busiest = max(enc_rows * lm.tp * lm.cp, lm_rows) if way == 0 else max(lm_rows * enc.tp, enc_rows)
    return s.network.exchange(busiest, 0, 1, layout.world_size)


def _send_s(s: Setting, layout: Layout, name: str, stage: int, chunks: int = 1) -> float:
    """One microbatch's message from stage `stage` of `name` to the next stage (or the LM), and its broadcast;
    an interleaved LM's virtual stage `stage` of pp x `chunks` sits on rank stage % pp and sends to the next."""
    cfg, grid, lm = s.cfg, layout.grids[name], layout.grids[LANGUAGE]
    per_stage = grid.tp * grid.cp * grid.dp
    src = grid.offset + stage % grid.pp * per_stage
    samples = cfg.data.global_batch / (cfg.parallel.microbatches * grid.dp)
    if name == LANGUAGE:
        if stage == grid.pp * chunks - 1:
            return 0.0
        nbytes = samples * s.sizes[LANGUAGE].tokens_per_sample * cfg.model.llm.hidden * 2 / grid.cp
        return s.network.send(nbytes, src, grid.offset + (stage + 1) % grid.pp * per_stage)
    if stage < grid.pp - 1:
        positions = inputs_per_sample(cfg, name) * encoder_rows(cfg, name)
        width = s.sizes[name].hidden
        return s.network.send(samples * positions * width * 2, src, src + per_stage)
    nbytes = samples * inputs_per_sample(cfg, name) * encoder_rows(cfg, name) * cfg.model.llm.hidden * 2
    return s.network.send(nbytes, src, lm.offset) + s.network.all_gather(nbytes, lm.offset, 1, lm.tp) / 2
