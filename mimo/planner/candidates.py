"""`mimo plan`: candidate layouts for N GPUs, each checked by the gate's `check_layout`, costed and ranked.

The candidates are a small deterministic set (at most a few hundred): homogeneous layouts (every module tp t,
dp N/t, replicated or FSDP, the LM with and without sequence parallel), colocated mixes (encoder tp_e, LM
tp_l, the LM sequence parallel when tp_l > 1) and pipelined ones (each encoder alone on the first N/2, N/4 or
N/8 ranks, replicated or FSDP-sharded, the LM on the rest with the least tp x pp that fits) and colocated pipelined
ones (every encoder whole on all ranks, the LM on the same ranks pipelined over each pp, at the tp predicted
fastest of those that fit: mimo.planner.predict's three phases). For an MoE LM
every colocated candidate comes again with the LM's experts split by each ep > 1 that divides N
(`expert_candidates`; the gate keeps those whose ep divides the LM's dp and moe_experts); pipelined ones (both
kinds) keep ep 1. Tensor parallelism stays inside a node (tp <= gpus per node). A candidate the trainer would refuse
(`Layout`, `check_layout`) is dropped, so the planner never suggests a layout that cannot run. Memory comes
from `mimo.planner.memory`, the predicted step time from `mimo.planner.predict`.

Ranking: layouts that fit by predicted step time (ties by memory); then the rest by memory alone. The
preference class (plain DP, FSDP, LM tp, split encoder, pipelined, colocated pipelined) only names the kind of
each row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from mimo.config.schema import LANGUAGE, Config, ConfigError, ModuleLayoutConfig
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout
from mimo.parallel.pipeline.rules import colocated_pipeline, is_pipelined
from mimo.perf.gpu_defaults import resolve_gpu_defaults
from mimo.planner.memory import GIB, ModuleSize, Usage, estimate, module_sizes, with_hf_shapes
from mimo.planner.network import Network
from mimo.planner.predict import Prediction, Setting, predict
from mimo.planner.profile import Profile, shipped_profile
from mimo.tasks import data_set
from mimo.train.gate import check_layout

PLAIN_DP, FSDP, LM_TP, SPLIT_ENCODER, PIPELINED, COLOCATED_PIPELINED = range(6)
"""Preference classes, best first (see the module docstring)."""
KIND = {PLAIN_DP: "data parallel", FSDP: "fsdp", LM_TP: "colocated", SPLIT_ENCODER: "tensor parallel",
        PIPELINED: "pipelined", COLOCATED_PIPELINED: "colocated pipelined"}
PIPELINE_SHARES = (2, 4, 8)
"""A pipelined candidate puts each encoder on N / share ranks."""
VIRTUAL_STAGES = 2
"""The model chunks per rank of a pipelined LM's interleaved candidate (interleaved 1F1B)."""

Modules = dict[str, ModuleLayoutConfig]


@dataclass(frozen=True)
class Row:
    """One costed candidate."""

    modules: Modules
    layout: Layout
    usage: Usage
    fits: bool
    klass: int
    why: str
    prediction: Prediction
    microbatches: int

    @property
    def peak_gib(self) -> float:
        return self.usage.peak / GIB


@dataclass(frozen=True)
class Plan:
    """Every valid candidate, best first, and what they were costed for."""

    rows: list[Row]
    gpus: int
    gpu_memory_gib: float
    sizes: dict[str, ModuleSize]
    profile: Profile
    network: Network


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def with_modules(cfg: Config, modules: Modules) -> Config:
    """`cfg` with its parallel tables replaced (the original is left alone)."""
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, modules=modules))


def vision(cfg: Config) -> list[str]:
    """Encoders that can take tensor parallelism (the ViT; audio encoders stay tp1)."""
    return [n for n, m in cfg.model.modalities.items() if m.kind == "vision"]


def colocated_candidates(cfg: Config, gpus: int, gpus_per_node: int = 8) -> list[Modules]:
    """Every module on all ranks: homogeneous (same tp, with/without FSDP and LM SP) and encoder/LM mixes
    (different tp, or one side FSDP-sharded where its tp is 1), tp inside a node."""
    out: list[Modules] = []
    tps = [t for t in divisors(gpus) if t <= max(gpus_per_node, 1)]
    for tp in tps:
        for fsdp in (False, True) if gpus // tp > 1 else (False,):
            for sp in (False, True) if tp > 1 else (False,):
                out.append(_colocated(cfg, tp, tp, sp, fsdp, fsdp))
    if not vision(cfg):
        return out
    shards = (False, True) if gpus > 1 else (False,)
    for enc_tp in tps:
        for lm_tp in tps:
            for enc_fsdp in shards if enc_tp == 1 else (False,):
                for lm_fsdp in shards if lm_tp == 1 else (False,):
                    if (enc_tp, enc_fsdp) != (lm_tp, lm_fsdp):
                        out.append(_colocated(cfg, enc_tp, lm_tp, lm_tp > 1, enc_fsdp, lm_fsdp))
    return out


def _colocated(cfg: Config, enc_tp: int, lm_tp: int, sp: bool, enc_fsdp: bool, lm_fsdp: bool) -> Modules:
    mods = {n: ModuleLayoutConfig(tp=enc_tp if n in vision(cfg) else 1, fsdp=enc_fsdp) for n in cfg.model.modalities}
    mods[LANGUAGE] = ModuleLayoutConfig(tp=lm_tp, sequence_parallel=sp, fsdp=lm_fsdp)
    return mods


def expert_candidates(cfg: Config, candidates: list[Modules], gpus: int) -> list[Modules]:
    """For an MoE LM, each of `candidates` with the LM's ep set to every divisor > 1 of `gpus` (expert
    parallelism carved out of its dp); the gate's `validate_expert_parallel` drops an ep that does not divide
    the LM's dp or moe_experts. None for a dense LM."""
    if not cfg.model.llm.moe_experts:
        return []
    return [{**m, LANGUAGE: dataclasses.replace(m[LANGUAGE], ep=ep)} for m in candidates for ep in divisors(gpus)[1:]]


def _lm_split_cost(r: Row) -> tuple:
    """Order of fitting LM layouts: least tp x pp, then least tp, then replicated before FSDP-sharded stages
    (sharding gathers every weight twice a microbatch), then replicated encoders before sharded ones (same
    reason), then least memory."""
    lm = r.layout.grids[LANGUAGE]
    encoders = any(m.fsdp for n, m in r.modules.items() if n != LANGUAGE)
    return lm.tp * lm.pp, lm.tp, r.modules[LANGUAGE].fsdp, encoders, r.usage.peak


def pipelined_candidates(cfg: Config, gpus: int, cost: Callable[[Modules], Row | None],
                         gpus_per_node: int = 8) -> list[Row]:
    """Each encoder dp on its own N/share ranks (replicated or FSDP-sharded over them), the LM on the rest (its
    stages replicated or, where the gate allows it, FSDP-sharded over their data lanes): per split, of the layouts
    the trainer accepts, the one with the least LM tp x pp (then `_lm_split_cost`'s order) that fits, else the one
    with the lowest estimate."""
    names = list(cfg.model.modalities)
    out: list[Row] = []
    for enc in sorted({gpus // s for s in PIPELINE_SHARES}, reverse=True):
        rest = gpus - enc * len(names)
        if enc < 1 or rest < 1 or not names:
            continue
        options = [cost({**{n: ModuleLayoutConfig(offset=i * enc, size=enc, fsdp=enc_fsdp)
                            for i, n in enumerate(names)},
                         LANGUAGE: ModuleLayoutConfig(offset=enc * len(names), size=rest, tp=tp, pp=pp, fsdp=fsdp)})
                   for enc_fsdp in ((False, True) if enc > 1 else (False,))
                   for tp in divisors(rest) if tp <= max(gpus_per_node, 1) for pp in divisors(rest // tp)
                   if pp <= cfg.model.llm.layers for fsdp in ((False, True) if rest // (tp * pp) > 1 else (False,))]
        out += _best_split(options, cost)
    return out


def colocated_pipelined_candidates(cfg: Config, gpus: int, cost: Callable[[Modules], Row | None],
                                   gpus_per_node: int = 8) -> list[Row]:
    """Every encoder on all ranks at tp 1 (replicated or FSDP-sharded), the LM on the same ranks pipelined over
    each pp >= 2 that divides `gpus` (at most its layers), at each tp inside a node (sequence parallel where tp >
    1), its stages replicated or FSDP-sharded: per pp, the fitting one predicted fastest (else the lowest
    estimate), and it again interleaved."""
    out: list[Row] = []
    for pp in divisors(gpus)[1:]:
        if pp > cfg.model.llm.layers or not cfg.model.modalities:
            continue
        rest = gpus // pp
        options = [cost({**{n: ModuleLayoutConfig(fsdp=enc_fsdp) for n in cfg.model.modalities},
                         LANGUAGE: ModuleLayoutConfig(tp=tp, pp=pp, sequence_parallel=tp > 1, fsdp=fsdp)})
                   for enc_fsdp in (False, True) for tp in divisors(rest) if tp <= max(gpus_per_node, 1)
                   for fsdp in ((False, True) if rest // tp > 1 else (False,))]
        out += _best_split(options, cost, _rank_key)
    return out


def _best_split(options: list[Row | None], cost: Callable[[Modules], Row | None],
                order: Callable[[Row], tuple] = _lm_split_cost) -> list[Row]:
    """Of one split's costed options (None: refused by the gate), the fitting one first in `order`, else the one
    with the lowest estimate; and that one again interleaved (`_interleaved`)."""
    rows = [r for r in options if r is not None]
    if not rows:
        return []
    fitting = [r for r in rows if r.fits]
    best = min(fitting, key=order) if fitting else min(rows, key=lambda r: r.usage.peak)
    return [best, *_interleaved(best, cost)]


def _interleaved(row: Row, cost: Callable[[Modules], Row | None]) -> list[Row]:
    """`row`'s layout again with its LM interleaved over VIRTUAL_STAGES model chunks per pipeline rank, where
    the LM is pipelined and the gate accepts it (`validate_virtual_stages`: layers >= pp x v, microbatches a
    multiple of pp): a smaller bubble for more activations in flight and more messages."""
    if row.layout.grids[LANGUAGE].pp < 2:
        return []
    lm = row.modules[LANGUAGE]
    again = cost({**row.modules, LANGUAGE: dataclasses.replace(lm, virtual_stages=VIRTUAL_STAGES)})
    return [again] if again is not None else []


def layout_of(cfg: Config, modules: Modules, gpus: int) -> Layout | None:
    """The Layout, or None when the trainer would refuse it (the same checks as `mimo train`, which checks the
    layout of more than one rank only)."""
    try:
        layout = Layout.from_config(modules, cfg.model.module_names, gpus)
        if gpus > 1:
            check_layout(with_modules(cfg, modules), layout)
    except ValueError:  # ConfigError included
        return None
    return layout


def as_trained(cfg: Config, modules: Modules, layout: Layout) -> Config:
    """`cfg` on `modules` with the train keys `mimo train` would run it with: the GPU defaults it applies on
    CUDA to the keys left unset (mimo.perf.gpu_defaults), for this layout. `cfg` is left alone."""
    planned = with_modules(cfg, modules)
    planned.left_unset = cfg.left_unset
    return resolve_gpu_defaults(planned, layout if layout.world_size > 1 else None)[0]


def encoder_tp(layout: Layout) -> int:
    """The widest tensor parallelism of any encoder (1 when none splits)."""
    return max((g.tp for n, g in layout.grids.items() if n != LANGUAGE), default=1)


def preference(layout: Layout, modules: Modules) -> int:
    """The row's preference class (see the module docstring)."""
    if colocated_pipeline(layout):
        return COLOCATED_PIPELINED
    if is_pipelined(layout):
        return PIPELINED
    if encoder_tp(layout) > 1:
        return SPLIT_ENCODER
    if layout.grids[LANGUAGE].tp > 1:
        return LM_TP
    return FSDP if any(m.fsdp for m in modules.values()) else PLAIN_DP


def why(layout: Layout, klass: int, usage: Usage, fits: bool, limit_gib: float, ep: int = 1,
        virtual: int = 1) -> str:
    """The row's reason in words (with the LM's `ep` > 1, what expert parallelism adds; with its `virtual`
    stages > 1, what interleaving does)."""
    reason = _why(layout, klass, usage, fits, limit_gib)
    if ep > 1:
        reason += f"; LM ep{ep}: 1/{ep} of the experts a GPU, their tokens sent by all-to-all"
    if virtual > 1:
        reason += f"; interleaved over {virtual} model chunks a rank: 1/{virtual} the bubble, more in flight"
    return reason


def _why(layout: Layout, klass: int, usage: Usage, fits: bool, limit_gib: float) -> str:
    if not fits:
        return (f"does not fit: needs {usage.peak / GIB:.1f} GiB > {limit_gib:g} (states "
                f"{usage.states / GIB:.1f}, activations {usage.activations / GIB:.1f})")
    lm = layout.grids[LANGUAGE]
    enc = {n: g for n, g in layout.grids.items() if n != LANGUAGE}
    enc_dp = "/".join(sorted({f"dp{g.dp}" for g in enc.values()})) or "-"
    if klass == PLAIN_DP:
        return "fits replicated: no model parallelism needed"
    if klass == FSDP:
        return f"fits with states sharded 1/{lm.dp} (FSDP); no tensor parallelism"
    if klass == LM_TP:
        return f"LM states need 1/{lm.tp}: LM tp{lm.tp}, encoder stays {enc_dp}"
    if klass == SPLIT_ENCODER:
        return (f"encoder split too (tp{encoder_tp(layout)}): TP costs compute and communication on a small "
                "encoder")
    if klass == COLOCATED_PIPELINED:
        return (f"colocated pipelined: {', '.join(enc)} whole on every GPU before and after the LM's pp{lm.pp} "
                f"pipeline (LM tp{lm.tp}); their activations of every microbatch wait across it")
    ranks = ", ".join(f"{n} on {g.size} GPU{'s' if g.size > 1 else ''}" for n, g in enc.items())
    return f"pipelined: {ranks} {'idles' if len(enc) == 1 else 'idle'} while the LM runs (1F1B)"


def microbatch_options(cfg: Config) -> list[int]:
    """The microbatch counts `choose_microbatches` tries: the config's and every divisor of data.global_batch up
    to 64."""
    return sorted({cfg.parallel.microbatches, *(d for d in divisors(cfg.data.global_batch) if d <= 64)})


def make_plan(cfg: Config, gpus: int, gpu_memory_gib: float, profile: Profile | None = None,
              network: Network | None = None, choose_microbatches: bool = False) -> Plan:
    """Every valid candidate for `gpus` GPUs of `gpu_memory_gib` GiB, costed and ranked best first; the time
    from `profile` (default: the shipped one of train.device) and `network` (default: `Network()`). With
    `choose_microbatches` each layout takes the parallel.microbatches (of `microbatch_options`) it runs fastest
    at among those that fit."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {gpus}; pass the number of GPUs to plan for, e.g. --gpus 8")
    if gpu_memory_gib <= 0:
        raise ConfigError(f"--gpu-memory-gib must be > 0, got {gpu_memory_gib:g}; e.g. --gpu-memory-gib 80")
    data_set(cfg)  # an unknown data.name is refused naming it, not as "no candidate layout passes"
    cfg = with_hf_shapes(cfg)  # the trainer's checks below see the real heads, vocab and mlp
    sizes = module_sizes(cfg)
    profile = profile or shipped_profile(cfg.train.device)
    network = network or Network()
    setting = Setting(cfg, sizes, profile, network)

    def cost(modules: Modules) -> Row | None:
        """The row at the config's microbatches, or with `choose_microbatches` the best of every count."""
        options = microbatch_options(cfg) if choose_microbatches else [cfg.parallel.microbatches]
        rows = [r for r in (cost_at(setting, modules, m, gpus, gpu_memory_gib) for m in options) if r is not None]
        return min(rows, key=_rank_key, default=None)

    colocated = colocated_candidates(cfg, gpus, network.gpus_per_node)
    colocated += expert_candidates(cfg, colocated, gpus)
    rows = [r for r in map(cost, colocated) if r is not None]
    rows += pipelined_candidates(cfg, gpus, cost, network.gpus_per_node)
    rows += colocated_pipelined_candidates(cfg, gpus, cost, network.gpus_per_node)
    if not rows:
        raise ConfigError(f"--gpus {gpus}: no candidate layout for {gpus} GPUs passes the config's checks "
                          f"(data.global_batch = {cfg.data.global_batch} must divide by parallel.microbatches x "
                          f"every module's dp; heads, vocab and mlp by tp); use a GPU count that divides "
                          f"data.global_batch, e.g. --gpus {_nearest_divisor(cfg.data.global_batch, gpus)}")
    rows.sort(key=_rank_key)
    return Plan(rows, gpus, gpu_memory_gib, sizes, profile, network)


def cost_at(setting: Setting, modules: Modules, micro: int, gpus: int, gpu_memory_gib: float) -> Row | None:
    """The costed row of `modules` at `micro` microbatches, or None when the trainer would refuse the layout."""
    cfg = setting.cfg
    at = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, microbatches=micro))
    at.left_unset = cfg.left_unset  # a class attribute's default, not a field: replace() leaves it behind
    layout = layout_of(at, modules, gpus)
    if layout is None:
        return None
    trained = as_trained(at, modules, layout)
    usage = estimate(trained, layout, setting.sizes, modules)
    klass, ok = preference(layout, modules), usage.peak <= gpu_memory_gib * GIB
    ep, v = (modules[LANGUAGE].ep, modules[LANGUAGE].virtual_stages) if LANGUAGE in modules else (1, 1)
    return Row(modules, layout, usage, ok, klass, why(layout, klass, usage, ok, gpu_memory_gib, ep, v),
               predict(dataclasses.replace(setting, cfg=trained), layout, modules), micro)


def _rank_key(row: Row) -> tuple:
    """Fitting rows by predicted step time, then memory; the rest by memory alone."""
    if not row.fits:
        return (1, row.usage.peak, 0.0)
    return (0, round(row.prediction.step_s, 12), row.usage.peak)


def _nearest_divisor(batch: int, gpus: int) -> int:
    return min((d for d in divisors(batch) if d > 1), key=lambda d: (abs(d - gpus), d), default=1)


def label(layout: Layout, modules: Modules) -> str:
    """A short name: 'dp8', 'tp2 dp4 +LM sp', 'images dp8 | LM tp2+sp dp4', 'images[0-1] dp2 | LM[2-7] pp3 dp2',
    'images[0-3] dp4 | LM[4-7] pp2 v2 dp2' (interleaved, 2 virtual stages), 'images dp4 | LM dp4 ep2' (the LM's
    experts split over 2 of its lanes)."""
    grids = layout.grids
    flags = {n: modules.get(n, ModuleLayoutConfig()) for n in grids}

    def one(name: str) -> str:
        g, f = grids[name], flags[name]
        parts = [f"tp{g.tp}" + ("+sp" if f.sequence_parallel else "")] if g.tp > 1 else []
        parts += [f"cp{g.cp}"] if g.cp > 1 else []
        parts += ([f"pp{g.pp}"] + ([f"v{f.virtual_stages}"] if f.virtual_stages > 1 else [])) if g.pp > 1 else []
        parts += [f"dp{g.dp}"] + ([f"ep{f.ep}"] if f.ep > 1 else []) + (["fsdp"] if f.fsdp else [])
        return " ".join(parts)

    same = len({(g.tp, g.cp, g.pp, g.dp, flags[n].fsdp, flags[n].ep) for n, g in grids.items()}) == 1
    if layout.colocated and same:
        enc = [n for n in grids if n != LANGUAGE]
        base = one(enc[0]) if enc else one(LANGUAGE)
        extra = flags[LANGUAGE].sequence_parallel and not (enc and flags[enc[0]].sequence_parallel)
        return f"{base} +LM sp" if extra else base
    names = {n: "LM" if n == LANGUAGE else n for n in grids}
    if layout.colocated:
        return " | ".join(f"{names[n]} {one(n)}" for n in sorted(grids, key=lambda n: n == LANGUAGE))
    return " | ".join(f"{names[n]}[{_span(g)}] {one(n)}" for n, g in
                      sorted(grids.items(), key=lambda x: x[1].offset))


def _span(grid: Grid) -> str:
    return str(grid.offset) if grid.size == 1 else f"{grid.offset}-{grid.end - 1}"


def to_toml(modules: Modules, microbatches: int, layout: Layout) -> str:
    """The `[parallel...]` tables to paste into a config (only the keys that differ from the defaults,
    offset/size only when modules sit on disjoint ranks)."""
    lines = ["[parallel]", f"microbatches = {microbatches}", ""]
    for name in sorted(modules, key=lambda n: (n == LANGUAGE, n)):
        m, grid = modules[name], layout.grids[name]
        lines.append(f"[parallel.modules.{name}]")
        if not layout.colocated:
            lines += [f"offset = {m.offset}", f"size = {m.size}"]
        lines.append(f"tp = {m.tp}  # dp = {grid.dp}")
        lines += [f"{k} = {getattr(m, k)}" for k in ("cp", "pp", "virtual_stages", "ep") if getattr(m, k) > 1]
        lines += [f"{k} = true" for k in ("sequence_parallel", "fsdp") if getattr(m, k)]
        lines.append("")
    return "\n".join(lines)


def param_count_text(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)
