"""Packed rows on pipelined layouts train exactly the unpacked samples in one process.

The global batch holds 24 padded samples of 3 to 16 tokens with 0, 1 or 2 images each; packed by first fit
into rows of 16 tokens, it has 16 rows for 24 samples (padded with empty rows to `batch_multiple`), so the
pipeline bridge also carries microbatches of another size than `data.global_batch / microbatches`. Each
layout's pipelined step on the packed batch (the document ids travel with the activations; every LM stage
builds its own block-diagonal mask, under context parallel that of its zigzag positions) is checked against
one process on the UNPACKED batch: the loss, every gradient and the weights after one AdamW step with
clipping, max |diff| <= 1e-5 x max |ref| (fp32).
"""

import contextlib

import pytest

from mimo.config.schema import Config, ModuleLayoutConfig
from mimo.data.packing import pack_batch
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import batch_multiple, validate_plan
from tests.support.configs import tiny_llm, tiny_vit, tiny_vlm
from tests.support.dist import rank_device, run_distributed
from tests.support.documents import padded_samples
from tests.support.parity import reference_and_parallel_copy, reference_step, step_matches_reference
from tests.support.tiny_run import metrics, train_losses, train_rank

RTOL = 1e-5
PAD, IMG, S, MICRO = 0, 60, 16, 4
IMAGES_PER_SAMPLE = [0, 2, 1, 1, 2, 0, 1, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0, 1, 0, 0, 2, 0, 1, 0]
# (LM pp, LM dp, virtual stages, LM cp) behind one encoder rank (rank 0), by world size
LAYOUTS = {3: [(2, 1, 1, 1), (2, 1, 2, 1)], 5: [(2, 2, 1, 1), (2, 1, 1, 2)]}


def _config(pp: int, dp: int, chunks: int, cp: int) -> Config:
    lm = ModuleLayoutConfig(offset=1, size=pp * dp * cp, pp=pp, cp=cp, virtual_stages=chunks)
    return tiny_vlm(tiny_llm(layers=pp * chunks, init_std=0.1), tiny_vit(layers=2, init_std=0.1), IMG,
                    {"images": ModuleLayoutConfig(offset=0, size=1), "language": lm}, MICRO, len(IMAGES_PER_SAMPLE))


def _run_case(rank: int, world: int, pp: int, dp: int, chunks: int, cp: int) -> float:
    """One layout; returns (on rank 0) the worst relative difference of loss, gradients and weights."""
    what = f"LM pp {pp} dp {dp} virtual stages {chunks} cp {cp}"
    cfg = _config(pp, dp, chunks, cp)
    batch = padded_samples(IMAGES_PER_SAMPLE, S, IMG, PAD)
    rows = batch_multiple(Layout.from_config(cfg.parallel.modules, ["language", "images"], world), MICRO)
    packed, _ = pack_batch(batch, PAD, S, rows)
    assert "document_ids" in packed and packed["input_ids"].shape[0] < batch["input_ids"].shape[0], what
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world, lambda model: reference_step(cfg, batch, model))
    pipe = plan.pipeline
    result = pipe.train_step(par, packed if pipe.needs_data else None, rank_device(), contextlib.nullcontext)
    worst = abs(result.loss - ref["loss"]) / abs(ref["loss"])
    assert worst <= RTOL, f"{what}: loss {result.loss} vs unpacked {ref['loss']}"
    return max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))


def _all_cases(rank: int, world: int) -> list[float]:
    return [_run_case(rank, world, *case) for case in LAYOUTS[world]]


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_packed_pipeline_equals_unpacked_single_process(world):
    worst = run_distributed(_all_cases, world, timeout=300)[0]
    for (pp, dp, chunks, cp), w in zip(LAYOUTS[world], worst):
        print(f"LM pp {pp} dp {dp} virtual stages {chunks} cp {cp}: max relative diff {w:.2e}")


def test_packing_passes_the_pipeline_gate():
    cfg = _config(2, 2, 1, 1)
    cfg.data.packing, cfg.data.pack_length = True, S
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, ["language", "images"], 5))


TRAIN = ["--model.llm.kv_heads=2", "--model.llm.layers=2", "--train.steps=3", "--data.global_batch=8"]
PIPELINE = ["--parallel.modules.images.size=1", "--parallel.modules.language.offset=1",
            "--parallel.modules.language.size=2", "--parallel.modules.language.pp=2", "--parallel.microbatches=2"]


def test_trainer_packed_on_a_pipeline_reproduces_the_unpacked_losses(tmp_path):
    """`mimo train`'s tiny demo packed on encoder rank 0 + LM pp2 logs the one-process unpacked run's losses."""
    ref = train_losses(tmp_path / "padded", *TRAIN)
    out = tmp_path / "pipelined_packed"
    run_distributed(train_rank, 3, str(out), [*TRAIN, "--data.packing=true", "--data.pack_length=48", *PIPELINE],
                    timeout=300)
    losses = [m["loss"] for m in metrics(out)]
    assert len(ref) == len(losses) == 3
    for step, (a, b) in enumerate(zip(losses, ref)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: packed pipeline {a} vs unpacked {b}"
