"""The benchmark's fast paths for `mimo train`: the attention backend, the chunked head + loss, one
product for each attention's q, k and v, FP8 linears of chosen modules, activation checkpointing of chosen
modules' blocks, and per-block (or, for encoders, whole-module) compilation.

Switched on by `perf.attention_backend`, `perf.chunked_loss`, `perf.fuse_qkv`, `precision.module_dtype.<m> =
"float8"`, `perf.activation_checkpointing`, `perf.compile` and `perf.encoder_compile`, on every layout, installed
in that order where torchtitan installs them: after the parallel plan's tensor, context and pipeline
parallelism, before its data parallelism (`ParallelPlan.parallelize(model, compute_paths=...)`), so FSDP2
wraps compiled, checkpointed blocks. All keep every parameter name, so checkpoints and plans do not notice. The
loss is the model runtime's (`ChunkedLMLoss`); the rest changes modules in place, through PyTorch's own APIs.
The step's own fast paths (`perf.loss_rows_only`, `precision.master_weights` with `grad_table`) belong to the
trainer's step and optimizer; `check_fast_path_layout` holds all of them to the layout, before any collective.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed import ProcessGroup

from mimo.config.schema import LANGUAGE, Config, ConfigError
from mimo.models.llm import DecoderLM
from mimo.models.loss import IGNORE_INDEX
from mimo.models.multimodal import BLOCK_STACKS, MimoModel
from mimo.models.runtime import ModelRuntime
from mimo.parallel.layout import Layout
from mimo.parallel.tensor import enter_head
from mimo.perf.float8 import Float8Swap, check_float8_layout, convert_float8
from mimo.perf.fused_qkv import fuse_qkv
from mimo.perf.linear_ce import linear_cross_entropy
from mimo.perf.regional import checkpoint_blocks, compile_blocks, use_sdpa_backend

ONE_PROCESS_ONLY = ("grad_table",)
"""Keys of the step's fast paths that run on one process only: the gradient table reads gradients before the
data-parallel reduction sums them (docs/performance.md). precision.master_weights runs on every layout:
each module's (each pipeline stage's) fp32 state sharded over its data lanes, FSDP2's over its shards."""


def head_chunked_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                      tp_group: ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`linear_cross_entropy` of a head weight (a vocab-parallel shard with `tp_group`: collective over it) in
    `hidden`'s dtype: the `mimo.models.llm.WeightLoss` that `DecoderLM.head_loss` runs."""
    return linear_cross_entropy(hidden, weight.to(hidden.dtype), labels, kernel="auto", tp_group=tp_group)


@dataclass(frozen=True)
class ChunkedLMLoss:
    """`ModelRuntime.loss_fn` of `perf.chunked_loss`: (loss sum, loss tokens) of the LM's head over `hidden`
    through `linear_cross_entropy`, in the autocast dtype where autocast is on, never forming the logits. With
    `tp_group` (a vocab-parallel LM) the hidden states enter the TP region as `tp_lm_loss`'s do and the loss is
    vocab-parallel (collective over the group; both results replicated on it). A `loss_mask` acts as a 0/1
    mask (positions where it is 0 take no loss). The product runs in `DecoderLM.head_loss`, an FSDP2 entry of
    the LM (and of an untied head sharded as its own unit)."""

    tp_group: ProcessGroup | None = None
    sequence_parallel: bool = False

    def __call__(self, hidden: torch.Tensor, lm: DecoderLM, labels: torch.Tensor,
                 loss_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if loss_mask is not None:
            labels = torch.where(loss_mask.bool(), labels, IGNORE_INDEX)
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        hidden = hidden.to(dtype)
        if self.tp_group is not None:
            hidden = enter_head(hidden, self.tp_group, self.sequence_parallel)
        return lm.head_loss(hidden, labels, functools.partial(head_chunked_loss, tp_group=self.tp_group))


def transformer_blocks(model: MimoModel, module: str) -> list[nn.Module]:
    """The transformer blocks of one module: the LM's decoder layers ("language"), or the blocks of each
    encoder of a modality, under any of BLOCK_STACKS (this rank's copies; blocks a pipeline stage
    released are never called)."""
    if module == "language":
        return list(model.language_model.layers.values())
    encoders = model.modality_submodules[module].encoders.values()
    stacks = [getattr(e, name) for e in encoders for name in BLOCK_STACKS
              if isinstance(getattr(e, name, None), nn.ModuleDict)]
    return [block for stack in stacks for block in stack.values()]


def apply_fast_paths(cfg: Config, model: MimoModel, runtime: ModelRuntime | None = None,
                     lm_tp: tuple[ProcessGroup, bool] | None = None,
                     float8_swap: Float8Swap | None = None) -> ModelRuntime:
    """Install what `cfg.perf` and `cfg.precision` ask for on a model laid out up to data parallelism (as the
    `compute_paths` of `ParallelPlan.parallelize`; on one process, on the built model) and return `runtime`
    (default: one process's) with the chunked loss where asked for, for `MimoModel.set_runtime`: fused
    q/k/v, the FP8 linears (after fused q/k/v, which keeps those three in bf16), then checkpointing before
    compiling, so that the checkpoint is traced into each compiled block. `lm_tp` = (TP group, sequence
    parallel) of a tensor-parallel LM (`ParallelPlan.lm_tensor_parallel`) makes the chunked loss vocab-parallel.
    `float8_swap` replaces torchao's conversion (mimo.perf.float8.convert_float8; the CPU tests' reference)."""
    runtime = runtime or ModelRuntime()
    if torch.device(cfg.train.device).type == "cuda":
        use_sdpa_backend(cfg.perf.attention_backend)
    if cfg.perf.chunked_loss:
        runtime = dataclasses.replace(runtime, loss_fn=ChunkedLMLoss(*(lm_tp or ())))
    if cfg.perf.fuse_qkv:
        fuse_qkv(model)
    convert_float8(cfg, model, float8_swap)
    for name in cfg.perf.activation_checkpointing:
        checkpoint_blocks(transformer_blocks(model, name))
    if cfg.perf.compile:
        compile_blocks(transformer_blocks(model, LANGUAGE), backend=cfg.perf.compile_backend)
        for name, sub in model.modality_submodules.items():
            if cfg.perf.encoder_compile == "whole":
                compile_blocks(sub.encoders.values(), backend=cfg.perf.compile_backend)
            else:
                compile_blocks(transformer_blocks(model, name), backend=cfg.perf.compile_backend)
    return runtime


def check_fast_path_layout(cfg: Config, layout: Layout) -> None:
    """The step's fast paths against a layout of more than one rank (pure: the same error on every rank,
    before any process group exists)."""
    for key in ONE_PROCESS_ONLY:
        if getattr(cfg.perf, key):
            raise ConfigError(f"perf.{key} = true runs on one process only: it reads gradients before the "
                              f"data-parallel reduction; set perf.{key} = false for a layout of {layout.world_size} "
                              "ranks")
    check_float8_layout(cfg, layout)
    lm = layout.grids[LANGUAGE]
    if cfg.perf.loss_rows_only and lm.tp > 1 and not cfg.perf.chunked_loss:
        raise ConfigError("perf.loss_rows_only = true under the LM's tensor parallelism runs through the "
                          "vocab-parallel chunked loss: set perf.chunked_loss = true")
