"""Which layouts are pipelined and which of their ranks read the batch, and what a pipelined layout needs beyond
`validate_plan`'s other rules: the checks the validation gate runs (pure) before `PipelinePlan` builds anything."""

from __future__ import annotations

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.parallel.layout import Layout


def is_pipelined(layout: Layout) -> bool:
    """Disjoint module grids, a single module with pp > 1, or a colocated layout whose LM has pp > 1
    (`colocated_pipeline`) run under the pipeline schedule."""
    if len(layout.grids) > 1:
        return not layout.colocated or colocated_pipeline(layout)
    return next(iter(layout.grids.values())).pp > 1


def colocated_pipeline(layout: Layout) -> bool:
    """Several modules on the same ranks, the LM with pp > 1: every encoder runs whole on every rank, beside the
    LM's stage (mimo.parallel.pipeline.colocated)."""
    return len(layout.grids) > 1 and layout.colocated and layout.grids[LANGUAGE].pp > 1


def validate_colocated_pipeline(cfg: Config, layout: Layout) -> None:
    """What a colocated layout with a pipelined LM needs beyond `validate_plan`'s other checks (which keep its
    encoders at pp = 1), pure: the Out path's modalities unsharded (their decoders run on the LM's last stage)."""
    for name, m in cfg.model.modalities.items():
        module = cfg.parallel.modules.get(name)
        if m.output_token_id >= 0 and module is not None and module.fsdp:
            raise ConfigError(f"parallel.modules.{name}.fsdp: '{name}' has an Out path, whose decoders run on the "
                              "last stage of a pipelined LM only, outside the sharded encoder's data lanes; set "
                              f"fsdp = false (or parallel.modules.language.pp = 1)")


def validate_pipeline(cfg: Config, layout: Layout) -> None:
    """What a pipelined layout needs beyond `validate_plan`'s other checks (the gate runs it). Pure."""
    lm = layout.grids[LANGUAGE]
    if colocated_pipeline(layout):
        validate_colocated_pipeline(cfg, layout)
    if cfg.model.llm.layers < lm.pp:
        raise ConfigError(f"parallel.modules.language.pp ({lm.pp}) exceeds model.llm.layers "
                          f"({cfg.model.llm.layers}); every stage needs a layer, use pp <= {cfg.model.llm.layers}")
    for name, m in cfg.parallel.modules.items():
        if m.fsdp and name != LANGUAGE and layout.grids[name].pp > 1:
            # EncoderStage runs an FSDP-sharded encoder whole (through encode_project, empty lanes included); a split
            # ViT's parts are called one by one, outside the submodule's FSDP entry.
            raise ConfigError(f"parallel.modules.{name}.fsdp: a pipelined encoder (pp = {layout.grids[name].pp}) "
                              "cannot be sharded; set fsdp = false or pp = 1")
        if m.fsdp and name == LANGUAGE and (lm.tp > 1 or lm.cp > 1 or m.ep > 1):
            raise ConfigError(f"parallel.modules.{name}.fsdp: sharding a pipelined LM is available with tp = cp = ep "
                              f"= 1 only (got tp {lm.tp}, cp {lm.cp}, ep {m.ep}); set fsdp = false or "
                              "parallel.modules.language.pp = 1")
    for name, m in cfg.model.modalities.items():
        grid = layout.grids[name]
        if grid.pp == 1:
            continue
        if m.kind != "vision":
            raise ConfigError(f"parallel.modules.{name}.pp = {grid.pp}: only vision encoders can be pipelined; "
                              "use pp = 1")
        if m.vit.layers < grid.pp:
            raise ConfigError(f"parallel.modules.{name}.pp ({grid.pp}) exceeds model.modalities.{name}.vit.layers "
                              f"({m.vit.layers}); use pp <= {m.vit.layers}")
        flags = cfg.parallel.modules.get(name)
        if flags is not None and flags.sequence_parallel:
            raise ConfigError(f"parallel.modules.{name}.sequence_parallel: a pipelined encoder cannot be sequence "
                              "parallel; set it to false or pp = 1")


def data_readers(layout: Layout) -> list[int]:
    """The ranks that read the batch on a pipelined layout (`PipelinePlan.needs_data`): every module's first
    stage and the LM's last stage. Pure."""
    readers: set[int] = set()
    for name, grid in layout.grids.items():
        stage = grid.size // grid.pp
        readers.update(range(grid.offset, grid.offset + stage))
        if name == LANGUAGE:
            readers.update(range(grid.end - stage, grid.end))
    return sorted(readers)
