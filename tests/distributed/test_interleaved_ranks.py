"""Interleaved 1F1B (`parallel.modules.language.virtual_stages = 2`) trains like one process on gloo ranks.

A vision encoder on rank 0 feeds an LM cut into pp x 2 model chunks of one layer each on ranks 1..pp (rank r
holds chunks r and r + pp), so activations wrap from the last LM rank back to the first and the encoder's
warm-up follows the interleaved LM. Three AdamW steps on three global batches (samples with 0..2 images) are
checked against one process: every step's loss and every weight after the last step, max |diff| <= 1e-5 x
max |ref| (fp32), and the loss of a forwards-only (evaluation) pass after them. The pp3 case ties the LM's
embeddings.
"""

import contextlib
import copy
from pathlib import Path

import pytest
import torch

from mimo.config.schema import Config
from mimo.models.build import build_model
from mimo.models.multimodal import modules_by_name
from mimo.parallel.plan import ParallelPlan
from mimo.train.optim import MimoOptimizer
from tests.support.configs import image_text_batch
from tests.support.dist import rank_device, run_distributed
from tests.support.interleaved_case import IMG, STEPS, S, interleaved_config
from tests.support.parity import freeze_key_biases, rel_diff
from tests.support.tiny_run import metrics, train_losses, train_rank

RTOL = 1e-5
# LM pp, microbatches, tied embeddings
CASES = {3: (2, 4, False), 4: (3, 3, True)}


def _batch(n: int, step: int) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    return image_text_batch(torch.randint(0, 3, (n,), generator=g), S, IMG, g)


def _reference(cfg: Config, model) -> tuple[list[float], dict]:
    opt = MimoOptimizer(modules_by_name(model), cfg.optim, 10)
    losses = []
    for step in range(STEPS):
        batch = _batch(cfg.data.global_batch, step)
        out = model(batch["input_ids"], labels=batch["labels"], modality_inputs=batch["modality_inputs"])
        loss = out.loss_sum / out.num_tokens
        loss.backward()
        losses.append(loss.item())
        assert opt.step(step)[0]
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _run_case(rank: int, world: int) -> float:
    """Returns (on rank 0) the worst relative difference of the losses and the weights after the last step."""
    cfg = interleaved_config(*CASES[world])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    freeze_key_biases(model)
    par = copy.deepcopy(model)
    ref_losses, ref_params = _reference(cfg, model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(par)
    opt = MimoOptimizer(modules_by_name(par), cfg.optim, 10, norm_sq_reduce=plan.norm_sq_reduce)
    pipe = plan.pipeline
    if pipe.module == "language":  # rank r of the LM holds the strided chunks r and r + pp, one layer each
        pp = CASES[world][0]
        assert list(par.language_model.layers) == [str(pipe.pp_rank), str(pipe.pp_rank + pp)]
    worst = 0.0
    for step in range(STEPS):
        batch = _batch(cfg.data.global_batch, step)
        result = pipe.train_step(par, batch if pipe.needs_data else None, rank_device(), contextlib.nullcontext)
        r = abs(result.loss - ref_losses[step]) / abs(ref_losses[step])
        assert r <= RTOL, f"world {world} step {step}: loss {result.loss} vs single-process {ref_losses[step]}"
        worst = max(worst, r)
        plan.finalize_grads(par)
        assert opt.step(step)[0]
    with torch.no_grad():  # evaluation: forwards only, in the interleaved order
        batch = _batch(cfg.data.global_batch, STEPS)
        out = model(batch["input_ids"], labels=batch["labels"], modality_inputs=batch["modality_inputs"])
        want = (out.loss_sum / out.num_tokens).item()
        got = pipe.train_step(par, batch if pipe.needs_data else None, rank_device(), contextlib.nullcontext,
                              backward=False).loss
    assert abs(got - want) <= RTOL * abs(want), f"world {world}: evaluation loss {got} vs single-process {want}"
    params = plan.gather_full(par)
    if rank != 0:
        return worst
    assert params.keys() == ref_params.keys(), "checkpoint names are one process's under interleaving"
    for name, t in params.items():
        r = rel_diff(t, ref_params[name])
        assert r <= RTOL, f"world {world}: weight {name} after {STEPS} steps off by {r:.3g} relative"
        worst = max(worst, r)
    return worst


@pytest.mark.parametrize("world", sorted(CASES))
def test_interleaved_1f1b_trains_like_single_process(world):
    worst = run_distributed(_run_case, world, timeout=600)[0]
    print(f"LM pp{CASES[world][0]} x 2 virtual stages: max relative diff {worst:.2e}")


LM_KEY, IMAGES_KEY = "--parallel.modules.language", "--parallel.modules.images"
TRAIN = ["--train.steps=6", "--model.llm.layers=4", "--parallel.microbatches=2"]
# the encoder on rank 0, the LM pp2 x 2 chunks on ranks 1-2
INTERLEAVED3 = [f"{IMAGES_KEY}.offset=0", f"{IMAGES_KEY}.size=1", f"{LM_KEY}.offset=1", f"{LM_KEY}.size=2",
                f"{LM_KEY}.pp=2", f"{LM_KEY}.virtual_stages=2", "--checkpoint.save_every=4"]


def test_an_interleaved_checkpoint_resumes_in_one_process(tmp_path):
    """The `Trainer` under `virtual_stages = 2` (set as a config key) takes one process's six steps, and its
    step-4 checkpoint (one process's parameter names) resumes in one process to the same last two steps."""
    threads = torch.get_num_threads()
    try:
        reference = train_losses(tmp_path / "one", *TRAIN)
        run_distributed(train_rank, 3, str(tmp_path / "interleaved"), [*TRAIN, *INTERLEAVED3], timeout=300)
        step4 = tmp_path / "interleaved" / "tiny" / "checkpoints" / "step_00000004"
        resumed = train_losses(tmp_path / "resumed", *TRAIN, f"--checkpoint.resume={step4}")
    finally:
        torch.set_num_threads(threads)
    interleaved = [r["loss"] for r in metrics(Path(tmp_path / "interleaved"))]
    assert len(interleaved) == len(reference) == 6 and len(resumed) == 2
    for what, got, want in (("interleaved", interleaved, reference), ("resumed", resumed, reference[4:])):
        for step, (a, b) in enumerate(zip(got, want, strict=True)):
            assert abs(a - b) <= RTOL * abs(b), f"{what} step {step}: loss {a} vs one process {b}"
