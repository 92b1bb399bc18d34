"""`validate_plan`: the layout rules the validation gate (mimo.train.gate) runs before any process group is
built, each refusal naming the field and the fix. Pure: config and layout in, ConfigError out.
"""

from __future__ import annotations

import math

import torch

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.parallel.data import FSDP_REDUCES_UNUSED_PARAMS
from mimo.parallel.expert.layout import validate_expert_parallel
from mimo.parallel.grid import Grid
from mimo.parallel.layout import Layout, check_heads_divisible
from mimo.parallel.pipeline.rules import colocated_pipeline, is_pipelined, validate_pipeline
from mimo.parallel.pipeline.virtual import validate_virtual_stages


def check_lm_features(cfg: Config, lm: Grid) -> None:
    """LM features (of imported families) that a layout or fast path would silently drop (pure)."""
    llm = cfg.model.llm
    if llm.qk_norm_full and lm.tp > 1:
        raise ConfigError(f"model.llm.qk_norm_full = true (OLMo 2) normalises q and k over all heads at once, which "
                          f"a tensor-parallel rank does not hold; set parallel.modules.language.tp = 1 (got {lm.tp})")
    module = cfg.parallel.modules.get(LANGUAGE)
    if llm.sliding_window and (lm.cp > 1 or (module is not None and module.sequence_parallel and lm.tp > 1)):
        raise ConfigError(f"model.llm.sliding_window = {llm.sliding_window} masks by row position, which context "
                          "or sequence parallelism hands each rank only part of; set parallel.modules.language.cp = 1 "
                          "and sequence_parallel = false")
    if llm.attn_softcap and lm.cp > 1:
        raise ConfigError(f"model.llm.attn_softcap = {llm.attn_softcap} (Gemma 2) needs its soft-capped attention, "
                          "which context parallel's replaces; set parallel.modules.language.cp = 1")
    if llm.logit_softcap and cfg.perf.chunked_loss:
        raise ConfigError(f"model.llm.logit_softcap = {llm.logit_softcap} (Gemma 2) caps the logits, which "
                          "perf.chunked_loss never forms; set perf.chunked_loss = false")


def validate_plan(cfg: Config, layout: Layout) -> None:
    """Every config/layout mismatch that would otherwise surface inside a collective (pure). The fast
    paths' layout checks (mimo.perf) run beside it, in the trainer and the planner."""
    pipelined = is_pipelined(layout)
    if cfg.perf.encoder_offload and not colocated_pipeline(layout):
        raise ConfigError(f"perf.encoder_offload = {cfg.perf.encoder_offload} frees encoder memory during the LM's "
                          "pipeline beside colocated encoders; set perf.encoder_offload = [], or colocate the "
                          "modules with parallel.modules.language.pp > 1")
    if pipelined:
        validate_pipeline(cfg, layout)
    llm = cfg.model.llm
    lm = layout.grids[LANGUAGE]
    check_heads_divisible(LANGUAGE, llm.heads, llm.kv_heads, lm.tp)
    check_lm_features(cfg, lm)
    for what, n in (("vocab", llm.vocab), ("mlp", llm.mlp)):
        if n % lm.tp:
            grown = "" if what != "vocab" or not llm.extra_tokens else (
                f" (model.llm.hf_path's vocabulary and model.llm.extra_tokens); add {-n % lm.tp} unused tokens to "
                "model.llm.extra_tokens (e.g. \"<|extra_1|>\") to make it so")
            raise ConfigError(f"model.llm.{what} ({n}) must be divisible by the LM's tp ({lm.tp}){grown}")
    micro = cfg.parallel.microbatches
    for name, grid in layout.grids.items():
        if cfg.data.global_batch % (micro * grid.dp):
            raise ConfigError(f"data.global_batch ({cfg.data.global_batch}) must be divisible by "
                              f"parallel.microbatches ({micro}) x the dp of '{name}' ({grid.dp})")
        if grid.pp != 1 and name != LANGUAGE and layout.colocated:
            raise ConfigError(f"parallel.modules.{name}.pp = {grid.pp}: an encoder on the LM's ranks runs whole on "
                              "every rank, beside the LM's pipeline stage; use pp = 1 (the LM may set pp), or give "
                              "the modules ranks of their own (parallel.modules.<name>.offset/size)")
        if grid.cp != 1 and name != LANGUAGE:
            raise ConfigError(f"parallel.modules.{name}.cp = {grid.cp}: context parallelism applies to the LM only; "
                              "use cp = 1 for modality encoders")
    validate_context_parallel(cfg, layout)
    validate_expert_parallel(cfg, layout)
    validate_virtual_stages(cfg, layout, pipelined)
    outs = out_modalities(cfg)
    sharded = [n for n in outs if n in cfg.parallel.modules and cfg.parallel.modules[n].fsdp]  # decoders live there
    if outs and sharded and not FSDP_REDUCES_UNUSED_PARAMS:
        raise ConfigError(f"parallel.modules.{sharded[0]}.fsdp = true with the Out path of {outs} needs FSDP2's "
                          f"set_reduce_scatter_unused_params, which torch {torch.__version__} lacks (a rank with no "
                          "output to decode would skip the decoder's reduce-scatter and hang); use fsdp = false or a "
                          "newer torch")
    for name, m in cfg.model.modalities.items():
        tp = layout.grids[name].tp
        if m.kind != "vision":
            if tp > 1:
                raise ConfigError(f"parallel.modules.{name}.tp = {tp}: tensor parallelism splits ViT encoders only, "
                                  f"and '{name}' is not a vision modality (kind = '{m.kind}'); use tp = 1 (it stays "
                                  "data parallel)")
            continue
        check_heads_divisible(name, m.vit.heads, m.vit.heads, tp)
        if m.vit.mlp % tp:
            raise ConfigError(f"model.modalities.{name}.vit.mlp ({m.vit.mlp}) must be divisible by its tp ({tp})")


def out_modalities(cfg: Config) -> list[str]:
    """The modalities the LM also generates (an Out-path decoder reads its hidden states)."""
    return [n for n, m in cfg.model.modalities.items() if m.output_token_id >= 0]


def validate_context_parallel(cfg: Config, layout: Layout) -> None:
    """CP/SP constraints known from the config alone (pure); sequence lengths are checked per batch."""
    lm = layout.grids[LANGUAGE]
    module = cfg.parallel.modules.get(LANGUAGE)
    sp_tp = lm.tp if module is not None and module.sequence_parallel else 1
    factor = (2 * lm.cp if lm.cp > 1 else 1) * sp_tp
    if cfg.data.packing and cfg.data.pack_length % factor:
        raise ConfigError(f"data.pack_length ({cfg.data.pack_length}) must be a multiple of {factor} (2 x cp x tp "
                          "with sequence parallel, 2 x cp without) for the LM's layout; round it up")


def batch_multiple(layout: Layout, microbatches: int) -> int:
    """Rows of a global batch must be a multiple of this: microbatches x every module's DP degree."""
    return microbatches * math.lcm(*(g.dp for g in layout.grids.values()))
