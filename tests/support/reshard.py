"""Continue a tiny run from a checkpoint under another layout, and compare its parameters."""

from __future__ import annotations

import torch

from mimo.data.batching import to_device
from mimo.models.loss import loss_weights
from mimo.models.step_hints import forward_args
from mimo.train.trainer import Trainer

EVAL_STEP = 1000


@torch.no_grad()
def eval_loss(tr: Trainer) -> float:
    """Collective: the per-token loss of one held-out global batch under the trainer's layout."""
    batch = tr.data.global_batch(EVAL_STEP, tr.cfg.data.global_batch, tr.cfg.data.seed)
    micro = [to_device(mb, tr.device) for mb in tr.plan.microbatches(batch)]
    loss = sum(tr.model(**forward_args(mb)).loss_sum for mb in micro)
    tokens = sum(loss_weights(mb["labels"], mb.get("loss_mask")).sum() for mb in micro).float()
    return float(tr.plan.all_reduce_lm_data(loss) / tr.plan.all_reduce_lm_data(tokens))


def continue_run(tr: Trainer, start: int) -> tuple[float, float, float]:
    """(eval loss now, loss of the next step, eval loss after it)."""
    before = eval_loss(tr)
    tr.model.train()
    step_loss = tr.train_step(start)["loss"]
    return before, step_loss, eval_loss(tr)


def params_close(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b))
