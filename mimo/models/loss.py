"""Per-token loss: sums and counts, never means.

Every rank returns the *sum* of its token losses and the *count* of its loss tokens. The trainer
divides once by the global count (all data lanes, all microbatches), which is what makes every
layout's gradients equal to single-process training on the same global batch (SPEC 3.1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def loss_weights(labels: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """1.0 where a position contributes to the loss, 0.0 elsewhere (ignored label or masked)."""
    w = (labels != IGNORE_INDEX).float()
    if loss_mask is not None:
        w = w * loss_mask.float()
    return w


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor,
                      loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, number of loss tokens) for logits `[..., V]` and labels `[...]`.

    Labels are already aligned with the positions that predict them (shifted by the data pipeline).
    """
    w = loss_weights(labels, loss_mask)
    safe = labels.clamp_min(0)
    per_token = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), safe.reshape(-1), reduction="none")
    return (per_token * w.reshape(-1)).sum(), w.sum()
