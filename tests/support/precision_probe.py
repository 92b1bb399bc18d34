"""Watch the output dtype of one linear in each module (encoder, projector, language model) of the tiny demo model."""

from __future__ import annotations

import torch

VIT_LINEAR = "modality_submodules.images.encoders.vit.layers.0.mlp.fc1"
PROJECTOR = "modality_submodules.images.input_projections.0.fc1"
LM_LINEAR = "language_model.layers.0.self_attn.q_proj"


def record_dtypes(model: torch.nn.Module) -> dict[str, list[torch.dtype]]:
    """Output dtypes of the watched linears this rank holds, filled on every call."""
    seen: dict[str, list[torch.dtype]] = {}
    modules = dict(model.named_modules())
    for name in (VIT_LINEAR, PROJECTOR, LM_LINEAR):
        if name in modules:
            seen[name] = []
            modules[name].register_forward_hook(lambda m, i, out, name=name: seen[name].append(out.dtype))
    return seen
