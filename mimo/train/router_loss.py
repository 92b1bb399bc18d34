"""The mixture-of-experts router losses in the step: their scale, their logged values, each expert's load,
and the sigmoid router's balancing bias.

The losses themselves reach the gradients inside the model (mimo.models.moe: each MoE layer seeds its
per-row loss sum with `loss_scale` in the backward). Here every MoE layer this rank holds gets

    loss_scale = 1 / (MoE layers of the LM * data.global_batch)

once, a constant of the config, so the objective is the same sum over the global batch's rows on every
layout. Per step: `begin` clears the layers' statistics, `end` sums them (the token copies routed to each
expert, the row losses) over the LM's data lanes, or on a pipelined layout over every stage's lanes, into
one table of every MoE layer of the LM on every rank, for the log; and `after_update` moves each sigmoid
router's `expert_bias` by `moe_bias_rate` toward balance (down where an expert's global load is above the
mean, up where below), from the same global counts on every rank.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mimo.config.schema import Config
from mimo.models.moe import moe_layers

Reduce = Callable[[torch.Tensor], torch.Tensor]
ROUTER_KEYS = ("moe_aux_loss", "moe_z_loss", "moe_load")


class RouterLosses:
    """The step's bookkeeping of the MoE layers of `model` held by this rank (a dense LM: every call is a no-op
    and makes no collective)."""

    def __init__(self, model: torch.nn.Module, cfg: Config, device: torch.device | str = "cpu"):
        llm = cfg.model.llm
        self.device = torch.device(device)  # where `end`'s reduction runs (the collectives' device)
        self.names = [str(i) for i in range(llm.layers) if llm.is_moe_layer(i)]  # every MoE layer of the LM
        held = moe_layers(model)  # "language_model.layers.3.mlp" (or with a wrapper's name inside) -> "3"
        self.layers = {self.names.index(name.split(".layers.")[1].split(".")[0]): m for name, m in held.items()}
        self.experts = llm.moe_experts
        self.scale = 1.0 / (max(1, len(self.names)) * cfg.data.global_batch)
        self.weights = (llm.moe_aux_loss_weight, llm.moe_z_loss_weight)
        self.bias_rate = llm.moe_bias_rate
        self.loads: torch.Tensor | None = None
        for m in self.layers.values():
            m.set_loss_scale(self.scale)

    def begin(self) -> None:
        for m in self.layers.values():
            m.clear_step_stats()

    def end(self, reduce: Reduce) -> tuple[float, dict]:
        """Collective (`reduce`: `ParallelPlan.sum_lm_rows`, which every rank joins) for an MoE LM: (the step's
        weighted router objective, the log: `moe_aux_loss` and `moe_z_loss` (unweighted, per row, averaged over the
        layers) and `moe_load` {layer: each expert's share of the token copies routed})."""
        self.loads = None
        if not self.names:
            return 0.0, {}
        rows = torch.zeros(len(self.names), self.experts + 2)
        for i, m in self.layers.items():
            stats = m.step_stats
            if not stats:  # a layer this rank does not run (another module's ranks of a pipelined layout)
                continue
            rows[i] = torch.cat([stats["load"], stats["balance"][None], stats["z_loss"][None]]).to(rows)
        total = reduce(rows.to(self.device)).cpu()
        self.loads = total[:, :-2]
        balance, z_loss = (float(total[:, i].sum() * self.scale) for i in (-2, -1))
        shares = self.loads / self.loads.sum(1, keepdim=True).clamp_min(1.0)
        log = {"moe_aux_loss": balance, "moe_z_loss": z_loss,
               "moe_load": {name: [round(v, 6) for v in row] for name, row in zip(self.names, shares.tolist())}}
        return self.weights[0] * balance + self.weights[1] * z_loss, log

    def after_update(self, stepped: bool) -> None:
        """Move the sigmoid routers' balancing biases by the step's global loads (after a taken step only)."""
        if not (stepped and self.bias_rate and self.loads is not None):
            return
        for i, m in self.layers.items():
            if m.expert_bias is not None:
                m.move_bias(self.loads[i], self.bias_rate)
