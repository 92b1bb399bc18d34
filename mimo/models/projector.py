"""Projections between an encoder's width and the LM's width (the LLaVA two-layer MLP)."""

from __future__ import annotations

from mimo.config.schema import ProjectorConfig
from mimo.models import init
from mimo.models.layers import MLP


class MLPProjector(MLP):
    """encoder width -> LM width -> LM width, with an activation between."""

    def __init__(self, dim_in: int, dim_out: int, cfg: ProjectorConfig, init_std: float = 0.02):
        super().__init__(dim_in, dim_out, dim_out, cfg.act, bias=cfg.bias)
        for lin in (self.fc1, self.fc2):
            init.normal_(lin.weight, std=init_std)
            if lin.bias is not None:
                init.zeros_(lin.bias)
