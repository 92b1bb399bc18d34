"""The benchmark's fast paths for `mimo train`: per-block compilation, the chunked head + loss, one
product for each attention's q, k and v, and activation checkpointing of chosen modules' blocks.

Switched on by `train.compile`, `train.chunked_loss`, `train.fuse_qkv` and `train.activation_checkpointing`,
applied to the model after the parallel plan has laid it out (all keep every parameter name, so
checkpoints and plans do not notice).
`check_fast_paths`, part of the plan's validation before any collective, names the field when a layout
is not supported yet.
"""

from __future__ import annotations

import torch
from torch import nn

from mimo.config.schema import Config, ConfigError
from mimo.models.llm import DecoderLM
from mimo.models.loss import IGNORE_INDEX
from mimo.models.multimodal import MimoModel
from mimo.parallel.layout import Layout
from mimo.parallel.pipeline.plan import is_pipelined
from mimo.perf.fused_qkv import fuse_qkv
from mimo.perf.linear_ce import linear_cross_entropy
from mimo.perf.regional import checkpoint_blocks, compile_blocks


def check_fast_paths(cfg: Config, layout: Layout) -> None:
    """ConfigError for switch/layout pairs without support (part of `validate_plan`): compiled blocks are
    tested with data parallelism only (TP, CP and the pipeline call collectives inside a block, and FSDP's
    hooks would be traced); the chunked loss computes full-vocabulary rows (TP has its vocab-parallel
    loss)."""
    if cfg.train.compile:
        if is_pipelined(layout):
            raise ConfigError("train.compile: modules on disjoint ranks run the pipeline schedule, which compiled "
                              "blocks do not support yet; set train.compile = false")
        for name, grid in layout.grids.items():
            m = cfg.parallel.modules.get(name)
            if grid.tp > 1 or grid.cp > 1 or (m is not None and m.fsdp):
                raise ConfigError(f"train.compile: parallel.modules.{name} uses tp/cp > 1 or fsdp, which compiled "
                                  "blocks do not support yet; set train.compile = false or use plain data "
                                  "parallelism")
    if cfg.train.fuse_qkv:
        for name, grid in layout.grids.items():
            if grid.tp > 1:
                raise ConfigError(f"train.fuse_qkv: parallel.modules.{name}.tp = {grid.tp} shards q, k and v by "
                                  "heads, each with its own forward; set train.fuse_qkv = false")
    lm_tp = layout.grids["language"].tp
    if cfg.train.chunked_loss and lm_tp > 1:
        raise ConfigError(f"train.chunked_loss: parallel.modules.language.tp = {lm_tp} already uses the "
                          "vocab-parallel loss, which never gathers the logits; set train.chunked_loss = false")


def chunked_lm_loss(hidden: torch.Tensor, lm: DecoderLM, labels: torch.Tensor,
                    loss_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """MimoModel's `loss_fn` contract through `linear_cross_entropy`: the head runs in the autocast
    dtype where autocast is on, and a `loss_mask` acts as a 0/1 mask (positions where it is 0 take no
    loss)."""
    if loss_mask is not None:
        labels = torch.where(loss_mask.bool(), labels, IGNORE_INDEX)
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    return linear_cross_entropy(hidden.to(dtype), lm.output_weight().to(dtype), labels, kernel="auto")


def transformer_blocks(model: MimoModel, module: str) -> list[nn.Module]:
    """The transformer blocks of one module: the LM's decoder layers ("language"), or the layers of each
    encoder of a modality (this rank's copies; blocks a pipeline stage released are never called)."""
    if module == "language":
        return list(model.language_model.layers.values())
    encoders = model.modality_submodules[module].encoders.values()
    return [block for encoder in encoders if hasattr(encoder, "layers") for block in encoder.layers.values()]


def apply_fast_paths(cfg: Config, model: MimoModel) -> None:
    """Install what `cfg.train` asks for on an already laid-out model (checkpointing before compiling, so
    that the checkpoint is traced into each compiled block)."""
    if cfg.train.chunked_loss:
        model.loss_fn = chunked_lm_loss
    if cfg.train.fuse_qkv:
        fuse_qkv(model)
    for name in cfg.train.activation_checkpointing:
        checkpoint_blocks(transformer_blocks(model, name))
    if cfg.train.compile:
        for name in ("language", *model.modality_submodules):
            compile_blocks(transformer_blocks(model, name))
