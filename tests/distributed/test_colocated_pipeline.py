"""Colocated layouts whose LM is pipelined train exactly what one process trains.

Every encoder runs whole on every rank beside the LM stage the rank holds; the step runs every encoder forward,
then the LM's 1F1B (or interleaved) pipeline, then every encoder backward, the rows and their gradients crossing
in one exchange each way (mimo.parallel.pipeline.colocated). Each layout's step on a global batch of 16 samples
in 4 microbatches, holding 0 to 3 images per sample (whole microbatches and data lanes text-only), is checked
against one process on the same batch: the loss, every gradient and the weights after one AdamW step with
clipping, max |diff| <= 1e-5 x max |ref| (fp32). Then `mimo train` on such a layout logs the one-process losses.
"""

import contextlib

import pytest
import torch

from mimo.config.schema import Config, ModuleLayoutConfig
from tests.support.configs import image_text_batch, tiny_llm, tiny_vit, tiny_vlm
from tests.support.dist import rank_device, run_distributed
from tests.support.parity import reference_and_parallel_copy, step_matches_reference
from tests.support.pipeline_case import IMG, MICRO, RTOL, S, pipeline_reference
from tests.support.tiny_run import metrics, train_losses, train_rank

# 0 to 3 images per sample; microbatch 2 is text-only, and so are LM lanes of microbatches 0 and 3
IMAGES = [0, 0, 3, 1, 2, 1, 0, 3, 0, 0, 0, 0, 1, 2, 0, 0]
# (images tp, LM tp, LM pp, virtual stages, sequence parallel, tied embeddings) by world size
LAYOUTS = {4: [(1, 1, 2, 1, False, False), (1, 1, 2, 2, False, True), (2, 1, 2, 1, False, False)]}


def _config(enc_tp: int, tp: int, pp: int, chunks: int, sp: bool, tied: bool) -> Config:
    lm = ModuleLayoutConfig(tp=tp, pp=pp, virtual_stages=chunks, sequence_parallel=sp)
    return tiny_vlm(tiny_llm(layers=pp * chunks + 1, init_std=0.1, tie_embeddings=tied),
                    tiny_vit(layers=2, init_std=0.1), IMG, {"images": ModuleLayoutConfig(tp=enc_tp), "language": lm},
                    MICRO, len(IMAGES))


def _run_case(rank: int, world: int, *layout) -> float:
    """One layout; returns (on rank 0) the worst relative difference of loss, gradients and weights."""
    enc_tp, tp, pp, chunks, sp, tied = layout
    what = f"images tp {enc_tp} + LM tp {tp} pp {pp} virtual stages {chunks} sp {sp} tied {tied}"
    cfg = _config(*layout)
    batch = image_text_batch(torch.tensor(IMAGES), S, IMG, torch.Generator().manual_seed(7))
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world, lambda m: pipeline_reference(cfg, batch, m))
    result = plan.pipeline.train_step(par, batch, rank_device(), contextlib.nullcontext)
    worst = abs(result.loss - ref["loss"]) / abs(ref["loss"])
    assert worst <= RTOL, f"{what}: loss {result.loss} vs one process {ref['loss']}"
    return max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))


def _all_cases(rank: int, world: int) -> list[float]:
    return [_run_case(rank, world, *case) for case in LAYOUTS[world]]


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_colocated_pipeline_equals_single_process(world):
    worst = run_distributed(_all_cases, world, timeout=300)[0]
    for case, w in zip(LAYOUTS[world], worst):
        print(f"{case}: max relative diff {w:.2e}")


TRAIN = ["--model.llm.layers=2", "--train.steps=3", "--data.global_batch=8", "--data.min_images_per_sample=0",
         "--data.images_per_sample=3"]
LAYOUT = ["--parallel.modules.images.tp=1", "--parallel.modules.language.pp=2", "--parallel.microbatches=2"]


def test_trainer_on_a_colocated_pipeline_reproduces_one_process(tmp_path):
    """`mimo train`'s tiny demo on images dp4 + LM pp2 x dp2 logs the one-process run's losses."""
    ref = train_losses(tmp_path / "one", *TRAIN)
    out = tmp_path / "colocated_pipeline"
    run_distributed(train_rank, 4, str(out), [*TRAIN, *LAYOUT], timeout=300)
    losses = [m["loss"] for m in metrics(out)]
    assert len(ref) == len(losses) == 3
    for step, (a, b) in enumerate(zip(losses, ref)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: colocated pipeline {a} vs one process {b}"
