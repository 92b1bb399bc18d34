"""Periodic evaluation (`train.eval_every`): the per-token loss of the held-out split, on the training layout.

It runs the sharded model where it lies, no gather: colocated layouts run each rank's microbatches forward
and sum the loss over the LM's data lanes, as a training step does; pipelined layouts run the pipeline's
forwards without backwards. Batches are whole global batches of the held-out samples in order (the data
set's `held_out_batches` / `held_out_batch`; rows past the last sample carry no loss), so every layout
evaluates the same rows. The loss is the text loss (an Out path's decoder loss is not part of it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from mimo.config.schema import Config
from mimo.data.batching import to_device
from mimo.data.checks import check_batch
from mimo.data.samples import BatchFailed
from mimo.models.loss import loss_weights
from mimo.models.multimodal import MimoModel
from mimo.models.step_hints import forward_args
from mimo.parallel.plan import ParallelPlan
from mimo.train.precision import step_autocast


def read_batch(read: Callable[[], dict], reads: bool) -> tuple[dict | None, str | None]:
    """(batch, None) from `read` on a pipeline rank that reads data, (None, None) on the others, and (None,
    why) where the data set raised BatchFailed, which every reader does at the same step: the pipeline's
    step then tells the ranks that read no data (mimo.parallel.pipeline.step.agree_on_input)."""
    if not reads:
        return None, None
    try:
        return read(), None
    except BatchFailed as e:
        return None, str(e)


def evaluate_held_out(cfg: Config, model: MimoModel, data: Any, plan: ParallelPlan, device: torch.device) -> dict:
    """{"loss": per-token loss, "tokens": loss tokens} of the whole held-out split. Collective: every rank
    calls it at the same step (on pipelined layouts only the ranks that read data build the batches); on one
    process `plan`'s sum is the identity."""
    pipe = plan.pipeline
    reads = pipe is None or pipe.needs_data
    total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, loss tokens
    was_training = model.training
    model.eval()
    # Blocks compiled for training would recompile for no-grad forwards; evaluate them eagerly.
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        for index in range(data.held_out_batches(cfg.data.global_batch)):
            if pipe is not None:
                batch, problem = read_batch(partial(data.held_out_batch, index, cfg.data.global_batch), reads)
                result = pipe.train_step(model, batch, device, lambda: step_autocast(cfg, device), backward=False,
                                         problem=problem)
                total += torch.tensor([result.loss * result.loss_tokens, result.loss_tokens], device=device)
            else:
                batch = data.held_out_batch(index, cfg.data.global_batch)
                total += _colocated_sums(cfg, model, batch, device, plan.microbatches)
    model.train(was_training)
    if pipe is None:
        plan.all_reduce_lm_data(total)
    loss_sum, tokens = total.tolist()
    return {"loss": loss_sum / max(tokens, 1.0), "tokens": int(tokens)}


def _colocated_sums(cfg: Config, model: MimoModel, batch: dict, device: torch.device,
                    microbatches: Callable[[dict], list[dict]]) -> torch.Tensor:
    """[loss sum, loss tokens] of this rank's microbatches of `batch` (not collective beyond the model's own)."""
    check_batch(model, batch)
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    for mb in (to_device(mb, device) for mb in microbatches(batch)):
        with step_autocast(cfg, device):
            out = model(**forward_args(mb))
        sums[0] += out.loss_sum.double()
        sums[1] += loss_weights(mb["labels"], mb.get("loss_mask")).sum().double()
    return sums
