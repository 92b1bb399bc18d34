"""How the Out path's losses join the objective, layout-independently.

The text loss is a sum over text tokens divided by the global text-token count (SPEC 3.1). Each
Out-path modality is treated the same way on its own: the sum of its decoder's per-output-token
losses over the whole global batch, divided by the global count of its output tokens (all
microbatches, all data lanes), times `model.modalities.<m>.output_loss_weight`:

    objective = text_sum / N_text + sum_m  w_m * out_sum_m / N_m

Every rank scales its local sums by these global counts before backward, so plain gradient sums over
data lanes give the same gradients as one process on the global batch, however the samples are split.
A modality with no output tokens in the global batch contributes zero (never NaN).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mimo.config.schema import ModelConfig
from mimo.models.multimodal import MimoOutput

Reduce = Callable[[torch.Tensor], torch.Tensor]


class OutPathLoss:
    """Per-step bookkeeping of the Out-path terms, in one fixed modality order on every rank.

    Per step: `begin` (global output-token counts: one sum over data lanes), `term` per microbatch (the
    differentiable share to add to the scaled text loss), `end` (the step's losses for the log). With
    no Out-path modality it makes no collective and every term is zero.
    """

    def __init__(self, cfg: ModelConfig):
        self.ids = {n: m.output_token_id for n, m in sorted(cfg.modalities.items()) if m.output_token_id >= 0}
        self.weights = torch.tensor([cfg.modalities[n].output_loss_weight for n in self.ids])
        self.keys = tuple(f"{n}_out_loss" for n in self.ids)
        self.counts = self.sums = torch.zeros(0)

    def begin(self, micro: list[dict], reduce: Reduce, device: torch.device) -> None:
        """Global count per modality of output tokens in microbatches that carry its targets."""
        counts = torch.zeros(len(self.ids), device=device)
        for mb in micro:
            targets = mb.get("modality_targets") or {}
            for i, (name, tid) in enumerate(self.ids.items()):
                if name in targets:
                    counts[i] += (mb["input_ids"] == tid).sum()
        self.counts = reduce(counts).clamp_min(1.0) if self.ids else counts
        self.sums = torch.zeros(len(self.ids), device=device)
        self.weights = self.weights.to(device)

    def term(self, out: MimoOutput) -> torch.Tensor:
        """sum_m w_m * out_sum_m / N_m for one microbatch's output (a modality it lacks adds zero)."""
        zero = torch.zeros((), device=out.hidden.device)
        if not self.ids:
            return zero
        sums = torch.stack([out.modality_loss_sums.get(n, zero).float() for n in self.ids])
        self.sums += sums.detach()
        return (self.weights * sums / self.counts).sum()

    def end(self, reduce: Reduce) -> tuple[float, dict[str, float]]:
        """(the step's weighted Out-path objective, each modality's unweighted per-output-token loss)."""
        if not self.ids:
            return 0.0, {}
        return self.summary(reduce(self.sums), self.counts)

    def summary(self, sums: torch.Tensor, counts: torch.Tensor) -> tuple[float, dict[str, float]]:
        """`end`'s result from the global sums and output-token counts per modality (a pipelined layout
        gathers them with the step's other numbers). Pure."""
        per_token = sums / counts.clamp_min(1.0)
        weights = self.weights.to(per_token.device, per_token.dtype)
        return float((weights * per_token).sum()), dict(zip(self.keys, per_token.tolist()))
