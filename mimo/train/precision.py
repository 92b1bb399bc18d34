"""Compute precision per module: `precision.dtype` for every module, `precision.module_dtype` for single ones.

Why this shape: parameters stay fp32 whatever the compute dtype (bf16 is autocast over fp32 weights), so a
module's precision is only the autocast state its computation runs in. The step's own autocast context
takes the language model's dtype, since the head and the loss belong to it. A "float8" module runs in bf16
autocast here; its linears' FP8 products are mimo/perf/float8.py's. A modality whose dtype
differs runs its encoders, projections and decoders each inside an autocast context of its own, nested in
the step's; autocast contexts nest and the innermost wins. That context is the model runtime's
(`ModelRuntime.modality_autocast`), so names, state dicts and parallel plans are untouched.
"""

from __future__ import annotations

import dataclasses

import torch

from mimo.config.schema import Config
from mimo.models.multimodal import MimoModel
from mimo.models.runtime import ModelRuntime


def step_autocast(cfg: Config, device: torch.device) -> torch.autocast:
    """The autocast context of a training step: bf16 when the language model computes in bf16 over fp32
    weights (none under precision.master_weights, whose weights are bf16 themselves)."""
    bf16 = cfg.precision.autocast_of("language") == "bfloat16" and not cfg.precision.master_weights
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def with_module_precision(cfg: Config, model: MimoModel, runtime: ModelRuntime) -> ModelRuntime:
    """`runtime` with its own autocast state for each modality whose dtype differs from the language model's
    (`ModelRuntime.modality_autocast`): every module the modality calls from outside (encoders, input and output
    projections, decoders) runs in it once the model is given the runtime."""
    lm, device_type = cfg.precision.autocast_of("language"), torch.device(cfg.train.device).type
    own = {n: (device_type, cfg.precision.autocast_of(n) == "bfloat16") for n in model.modality_submodules
           if cfg.precision.autocast_of(n) != lm}
    return dataclasses.replace(runtime, modality_autocast=own)
