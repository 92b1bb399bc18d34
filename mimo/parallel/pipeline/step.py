"""What a pipelined step returns (`StepResult`) and how its ranks agree that a batch is usable (`agree_on_input`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


def agree_on_input(problem: str | None, device: torch.device) -> None:
    """Collective over the world: raise on every rank if any rank found the batch unusable.

    Only ranks with a first or last stage read the batch, so only they can find a bad one; without this,
    they would raise while every other rank waited for their messages. A step's cost is one one-element
    all-reduce; the ranks' messages are gathered only when something was wrong.
    """
    flag = torch.tensor([float(problem is not None)], device=device)
    dist.all_reduce(flag)
    if flag.item() == 0:
        return
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, problem)
    raise ValueError("bad batch: " + "; ".join(m for m in messages if m))


@dataclass(frozen=True)
class StepResult:
    """A step's numbers, identical on every rank: mean text loss per token, loss tokens, input tokens, model
    FLOPs (mimo.models.flops; carried in float64, so exact below 2^53); the Out path's weighted objective and
    each modality's per-output-token loss (mimo.models.out_loss, `OutPathLoss.end`)."""

    loss: float
    loss_tokens: int
    tokens: int
    flops: int
    out_objective: float = 0.0
    out_losses: dict[str, float] = field(default_factory=dict)
