"""Compute precision per module: `train.dtype` for every module, `train.module_dtype` for single ones.

Why this shape: parameters stay fp32 whatever the compute dtype (bf16 is autocast over fp32 weights), so a
module's precision is only the autocast state its computation runs in. The step's own autocast context
takes the language model's dtype, since the head and the loss belong to it. A "float8" module runs in bf16
autocast here; its linears' FP8 products are mimo/perf/float8.py's. A modality whose dtype
differs runs its encoders, projections and decoders each inside an autocast context of its own, nested in
the step's; autocast contexts nest and the innermost wins. The forwards are swapped from outside, as
`checkpoint_blocks` does, so names, state dicts and parallel plans are untouched.
"""

from __future__ import annotations

import types
from collections.abc import Iterable

import torch
from torch import nn

from mimo.config.schema import Config
from mimo.models.multimodal import MimoModel


def step_autocast(cfg: Config, device: torch.device) -> torch.autocast:
    """The autocast context of a training step: bf16 when the language model computes in bf16 over fp32
    weights (none under train.master_weights, whose weights are bf16 themselves)."""
    bf16 = cfg.train.autocast_of("language") == "bfloat16" and not cfg.train.master_weights
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def _forward_in_own_precision(self: nn.Module, *args, **kwargs):
    device_type, enabled = self.own_autocast
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled):
        return type(self).forward(self, *args, **kwargs)


def _run_in(modules: Iterable[nn.Module], device_type: str, bf16: bool) -> None:
    for m in modules:
        m.own_autocast = (device_type, bf16)
        m.forward = types.MethodType(_forward_in_own_precision, m)


def apply_module_precision(cfg: Config, model: MimoModel) -> list[str]:
    """Give each modality whose dtype differs from the language model's its own autocast state; returns
    their names. Every module a modality calls from outside (encoders, input and output projections,
    decoders) runs in it."""
    lm, device_type = cfg.train.autocast_of("language"), torch.device(cfg.train.device).type
    changed = [n for n in model.modality_submodules if cfg.train.autocast_of(n) != lm]
    for name in changed:
        sub = model.modality_submodules[name]
        parts = [*sub.encoders.values(), *sub.input_projections, *sub.output_projections, *sub.decoders.values()]
        _run_in(parts, device_type, cfg.train.autocast_of(name) == "bfloat16")
    return changed
