"""Pipelined layouts (encoder and LM on disjoint ranks, each with its own tp x pp x dp) equal
single-process training, tensor by tensor.

Every layout of the issue's table runs 4 microbatches of 4 samples under the multi-module 1F1B
schedule. Samples hold 0, 1 or 2 images (so rows per sample vary across both bridge directions:
fan-in, fan-out and equal) and microbatch 2 holds none at all. Checked against one process on the
same global batch: the loss, every gradient of encoder, projector and LM, and the weights after one
AdamW step with clipping, max |diff| <= 1e-5 x max |ref| (fp32). Some layouts tie the LM's
embeddings, so the first and last LM stages' copies must get the summed gradient.
"""

import contextlib
import re

import pytest
import torch

from mimo.data.batching import COUNTS
from mimo.models.build import build_model
from mimo.models.flops import train_step_flops
from mimo.parallel.plan import ParallelPlan
from tests.support.dist import rank_device, run_distributed
from tests.support.parity import reference_and_parallel_copy, step_matches_reference
from tests.support.pipeline_case import RTOL, pipeline_batch, pipeline_config, pipeline_reference

# (encoder (tp, pp, dp), LM (tp, pp, dp), tied LM embeddings, LM sequence parallel), by world size
LAYOUTS = {
    2: [((1, 1, 1), (1, 1, 1), False, False)],
    4: [((1, 1, 1), (1, 3, 1), True, False)],
    8: [((2, 1, 1), (2, 3, 1), False, True), ((2, 2, 1), (2, 2, 1), True, False),
        ((1, 1, 4), (2, 2, 1), True, False), ((2, 2, 1), (1, 1, 4), False, False),
        ((1, 1, 2), (2, 3, 1), True, False)],
}


# Context parallel across the pipeline: LM (tp, pp, dp, cp) behind a bridge (pp 1) and cut into stages,
# beside an encoder that is itself pipelined; with sequence parallel inside the CP ranks too.
CP_LAYOUTS = {
    4: [((1, 1, 2), (1, 1, 1, 2), False, False)],
    8: [((1, 2, 1), (1, 3, 1, 2), True, False), ((1, 2, 2), (2, 1, 1, 2), False, True),
        ((1, 1, 2), (1, 3, 1, 2), False, False)],
}


def _run_case(rank: int, world: int, enc: tuple, lm: tuple, tied: bool, sp: bool) -> float:
    """One layout; returns (on rank 0) the worst relative difference of loss, gradients and weights."""
    what = f"encoder {enc} LM {lm} tied {tied} sp {sp}"
    cfg = pipeline_config(enc, lm, tied, sp)
    batch = pipeline_batch()
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world,
                                                      lambda model: pipeline_reference(cfg, batch, model))
    pipe = plan.pipeline
    result = pipe.train_step(par, batch if pipe.needs_data else None, rank_device(), contextlib.nullcontext)
    worst = abs(result.loss - ref["loss"]) / abs(ref["loss"])
    assert worst <= RTOL, f"{what}: loss {result.loss} vs {ref['loss']}"
    assert result.flops == train_step_flops(cfg.model, batch), f"{what}: the step's FLOPs are counted once"
    worst = max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))
    return worst


def _all_cases(rank: int, world: int) -> list[float]:
    return [_run_case(rank, world, *case) for case in LAYOUTS[world]]


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_pipelined_layouts_equal_single_process(world):
    worst = run_distributed(_all_cases, world, timeout=600)[0]
    for (enc, lm, _, _), w in zip(LAYOUTS[world], worst):
        print(f"encoder {enc} LM {lm}: max relative diff {w:.2e}")


def _all_cp_cases(rank: int, world: int) -> list[float]:
    return [_run_case(rank, world, *case) for case in CP_LAYOUTS[world]]


@pytest.mark.parametrize("world", sorted(CP_LAYOUTS))
def test_context_parallel_across_the_pipeline_equals_single_process(world):
    """LM cp2 behind a pipeline bridge, cp2 x pp3 (with a pipelined encoder and tied embeddings, or without),
    and cp2 x tp2 + SP: each CP rank runs its zigzag positions through every LM stage."""
    worst = run_distributed(_all_cp_cases, world, timeout=600)[0]
    for (enc, lm, _, _), w in zip(CP_LAYOUTS[world], worst):
        print(f"encoder {enc} LM {lm}: max relative diff {w:.2e}")


def _bad_batch_case(rank: int, world: int, damage: str) -> str:
    """Returns the error this rank raised for a damaged batch (every rank must raise, none may hang)."""
    cfg = pipeline_config((1, 1, 1), (1, 1, 1), False)
    batch = pipeline_batch()
    if damage == "placeholders":
        batch["input_ids"][3, 1] = 7  # sample 3 has one image (4 rows) but now only 3 placeholders
    elif damage == "labels":
        batch["labels"][2, 3] = cfg.model.llm.vocab + 1  # a label past the head: only the LM rank reads labels
    else:
        batch[COUNTS]["images"] = batch[COUNTS]["images"].clone()
        batch[COUNTS]["images"][1] = 1  # sample 1 claims one image fewer than the pixels hold
    torch.manual_seed(0)
    model = build_model(cfg.model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(model)
    pipe = plan.pipeline
    with pytest.raises(ValueError) as err:
        pipe.train_step(model, batch if pipe.needs_data else None, rank_device(), contextlib.nullcontext)
    return str(err.value)


@pytest.mark.parametrize("damage, message, origin", [
    ("placeholders", r"Number of images tokens \(3\) does not match number of images embeddings \(4\) in sample 3",
     "rank 0 (images stage 0)"),
    ("counts", r"modality_counts\['images'\] sums to 10 but input 'images.vit.pixel_values' holds 11 items",
     "rank 0 (images stage 0)"),
    ("labels", r"labels\[2, 3\] = \d+ lies outside the LM's vocabulary", "rank 1 (language stage 0)"),
])
def test_a_bad_batch_raises_on_every_rank_instead_of_hanging(damage, message, origin):
    """Only the rank that reads the damaged part can see it (the encoder rank the pixels, the LM rank the
    labels); every other rank must raise too."""
    messages = run_distributed(_bad_batch_case, 2, damage, timeout=60)
    assert len(messages) == 2 and messages[0] == messages[1], messages
    assert re.search(message, messages[0]) and origin in messages[0], messages[0]
