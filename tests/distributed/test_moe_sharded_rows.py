"""The MoE router losses where a row is split over ranks equal single-process training: context parallel (cp2),
LM sequence parallel (tp2), and cp2 x tp2 without sequence parallel (rows split over cp only).

One spawn of 4 gloo ranks, the VLM colocated on all of them, a softmax top-2 router with both router losses at
weights large enough to move the gradients. Each case against one process on the same seeded model and batch:
loss, every gradient and every weight after one AdamW step with clipping, max |diff| <= 1e-5 x max |ref|; and the
logged router losses and expert loads of the trainer's bookkeeping (mimo.train.router_loss) equal one process's.
"""

import copy

import torch

from mimo.models.build import build_model
from mimo.models.multimodal import modules_by_name
from mimo.models.step_hints import forward_args
from mimo.parallel.plan import ParallelPlan
from mimo.train.optim import MimoOptimizer
from mimo.train.router_loss import RouterLosses
from tests.support.dist import run_distributed
from tests.support.expert_case import N, moe_batch, moe_config, moe_prepare
from tests.support.parity import close, colocated_step, grads_then_step, step_matches_reference

RTOL = 1e-5


def _reference(cfg, batch: dict) -> dict:
    torch.manual_seed(0)
    model = build_model(cfg.model)
    moe_prepare(model, "softmax")
    router = RouterLosses(model, cfg)
    router.begin()
    model.train()
    out = model(**forward_args({k: v for k, v in batch.items() if k != "modality_counts"}))
    (out.loss_sum / out.num_tokens).backward()
    _, log = router.end(lambda t: t)
    grads, params = grads_then_step(cfg, model)
    return {"loss": (out.loss_sum / out.num_tokens).detach(), "grads": grads, "params": params, "log": log}


def _run_case(rank: int, world: int, lm: dict, micro: int) -> float:
    what = f"lm {lm} micro {micro}"
    cfg = moe_config(lm, "softmax", micro)
    batch = moe_batch()
    ref = _reference(cfg, copy.deepcopy(batch))
    torch.manual_seed(0)
    with torch.device("meta"):
        par = build_model(cfg.model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(par)
    moe_prepare(par, "softmax")
    router = RouterLosses(par, cfg)
    router.begin()
    par.train()
    opt = MimoOptimizer(modules_by_name(par), cfg.optim, 10, norm_sq_reduce=plan.norm_sq_reduce)
    loss, _ = colocated_step(plan, par, batch)
    worst = close(f"{what} loss", loss, ref["loss"], RTOL)
    _, log = router.end(plan.all_reduce_lm_data)
    for key in ("moe_aux_loss", "moe_z_loss"):
        worst = max(worst, close(f"{what} {key}", torch.tensor(log[key]), torch.tensor(ref["log"][key]), RTOL))
    for layer, shares in log["moe_load"].items():
        want = torch.tensor(ref["log"]["moe_load"][layer])
        worst = max(worst, close(f"{what} load {layer}", torch.tensor(shares), want, RTOL))
    worst = max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))
    return worst


CASES = [(dict(cp=2), 1), (dict(tp=2, sequence_parallel=True), 2), (dict(cp=2, tp=2), 1)]


def _all_cases(rank: int, world: int) -> list[float]:
    assert N % 2 == 0
    return [_run_case(rank, world, lm, micro) for lm, micro in CASES]


def test_router_losses_on_split_rows_equal_single_process():
    worst = run_distributed(_all_cases, 4, timeout=600)
    print("max relative diff per case (rank 0):", [f"{w:.2e}" for w in worst[0]])
