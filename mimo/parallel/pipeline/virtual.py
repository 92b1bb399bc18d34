"""Interleaved 1F1B's config: parallel.modules.<name>.virtual_stages, the model chunks per pipeline rank.

With v virtual stages the LM's layers are cut into pp x v contiguous chunks and rank r of the pipeline holds
chunks r, r + pp, ..., r + (v - 1) pp (`split.chunk_layers`); `schedule.interleaved_order` runs them
(Megatron's interleaved schedule), shrinking the bubble from (pp - 1) / m to (pp - 1) / (v m) of the step.
Layer keys stay global, so checkpoints keep one process's parameter names whatever v is.
"""

from __future__ import annotations

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.parallel.layout import Layout


def virtual_stages(cfg: Config, name: str) -> int:
    """parallel.modules.<name>.virtual_stages: the model chunks each of the module's pipeline ranks holds."""
    module = cfg.parallel.modules.get(name)
    return 1 if module is None else module.virtual_stages


def validate_virtual_stages(cfg: Config, layout: Layout, pipelined: bool) -> None:
    """parallel.modules.<name>.virtual_stages (interleaved 1F1B) against the layout, `pipelined` or not
    (`is_pipelined`); pure, `validate_plan` runs it. Each refusal names the field and the fix."""
    for name, module in cfg.parallel.modules.items():
        v = module.virtual_stages
        where = f"parallel.modules.{name}.virtual_stages"
        if v < 1:
            raise ConfigError(f"{where} = {v} must be >= 1 (1 = plain 1F1B)")
        if v > 1 and name != LANGUAGE:
            raise ConfigError(f"{where} = {v}: the interleaved schedule runs the language model's pipeline only; "
                              "use virtual_stages = 1")
    v, lm = virtual_stages(cfg, LANGUAGE), layout.grids[LANGUAGE]
    if v == 1:
        return
    where, micro, layers = "parallel.modules.language.virtual_stages", cfg.parallel.microbatches, cfg.model.llm.layers
    if lm.pp < 2 or not pipelined:
        raise ConfigError(f"{where} = {v} interleaves pipeline stages, and the LM is not pipelined (pp = {lm.pp}); "
                          "set parallel.modules.language.pp >= 2 or virtual_stages = 1")
    if layers < lm.pp * v:
        raise ConfigError(f"{where} = {v} cuts model.llm.layers ({layers}) into pp x virtual_stages = {lm.pp * v} "
                          f"model chunks, each needing a layer; use virtual_stages <= {layers // lm.pp}")
    if micro % lm.pp:
        raise ConfigError(f"{where} = {v}: the interleaved schedule runs microbatches in groups of pp, so "
                          f"parallel.microbatches ({micro}) must be a multiple of parallel.modules.language.pp "
                          f"({lm.pp}); use microbatches = {(micro // lm.pp + 1) * lm.pp}")
