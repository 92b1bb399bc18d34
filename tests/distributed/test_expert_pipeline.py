"""Expert parallelism on a pipelined layout (the encoder on its own rank, the MoE LM on four others, cut into two
stages or not) equals single-process training.

The batch, microbatches and reference of tests/distributed/test_pipeline.py (4 microbatches under the 1F1B
schedule, samples with 0-2 images, one microbatch with none); the LM's MoE layers route softmax top-2 with
both router losses, their scale set as the trainer sets it. Checked: the loss, every gradient, every weight
after one AdamW step with clipping, max |diff| <= 1e-5 x max |ref|.
"""

import contextlib

import torch

from mimo.config.schema import Config
from mimo.models.build import build_model
from mimo.models.moe import moe_layers
from mimo.models.multimodal import modules_by_name
from mimo.parallel.plan import ParallelPlan
from mimo.train.optim import MimoOptimizer
from tests.support.configs import tiny_llm, tiny_vit, tiny_vlm
from tests.support.dist import rank_device, run_distributed
from tests.support.parity import freeze_key_biases, step_matches_reference
from tests.support.pipeline_case import IMG, MICRO, PER_MB, RTOL, pipeline_batch, pipeline_module, pipeline_reference

# LM (tp, pp, dp) on ranks 1..4 beside the encoder on rank 0, and its ep
CASES = [((1, 2, 2), 2), ((1, 1, 4), 4), ((1, 1, 4), 2)]


def _config(lm: tuple[int, int, int], ep: int) -> Config:
    llm = tiny_llm(layers=3, init_std=0.1, moe_experts=4, moe_mlp=16, moe_top_k=2, moe_aux_loss_weight=0.1,
                   moe_z_loss_weight=0.01)
    language = pipeline_module(1, *lm)
    language.ep = ep
    modules = {"images": pipeline_module(0, 1, 1, 1), "language": language}
    return tiny_vlm(llm, tiny_vit(layers=2, init_std=0.1), IMG, modules, MICRO, PER_MB * MICRO)


def _prepare(model) -> None:
    layers = moe_layers(model)
    for moe in layers.values():
        moe.set_loss_scale(1.0 / (3 * PER_MB * MICRO))  # 3 MoE layers of the whole LM, whatever this stage holds
    freeze_key_biases(model)


def _run_case(rank: int, world: int, lm: tuple, ep: int) -> float:
    what = f"LM {lm} ep {ep}"
    cfg = _config(lm, ep)
    batch = pipeline_batch()
    torch.manual_seed(0)
    model = build_model(cfg.model)
    _prepare(model)
    ref = pipeline_reference(cfg, batch, model)
    torch.manual_seed(0)
    with torch.device("meta"):
        par = build_model(cfg.model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(par)
    _prepare(par)
    held = {n: p.shape[0] for n, p in par.named_parameters() if n.endswith("w_gate")}
    assert (rank == 0) == (not held) and all(e == 4 // ep for e in held.values()), f"{what}: rank {rank} holds {held}"
    opt = MimoOptimizer(modules_by_name(par), cfg.optim, 10, norm_sq_reduce=plan.norm_sq_reduce)
    pipe = plan.pipeline
    result = pipe.train_step(par, batch if pipe.needs_data else None, rank_device(), contextlib.nullcontext)
    worst = abs(result.loss - ref["loss"]) / abs(ref["loss"])
    assert worst <= RTOL, f"{what}: loss {result.loss} vs {ref['loss']}"
    worst = max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))
    return worst


def _all_cases(rank: int, world: int) -> list[float]:
    return [_run_case(rank, world, lm, ep) for lm, ep in CASES]


def test_expert_parallel_pipelined_layouts_equal_single_process():
    worst = run_distributed(_all_cases, 5, timeout=600)
    print("max relative diff per case (rank 0):", [f"{w:.2e}" for w in worst[0]])
