"""Expert parallelism equals single-process training: ep2 and ep4 over the LM's dp, ep2 x tp2 (TP on attention, with
and without sequence parallel), ep2 x cp2, and ep with FSDP (the experts sharded over their edp ranks, everything else
over the LM's dp).

All cases run in one spawn of 4 gloo ranks, the VLM colocated on all of them. The parallel model is built on
the meta device, so each rank materialises only its experts (with the single-process values for its slices).
Routers: a softmax top-2 router with both router losses (under cp and sequence parallel their row statistics are
summed over the row's ranks), a plain top-2 one, and an imbalanced one (sigmoid top-1 with a balancing bias that
sends every token to expert 0, so the other experts' ranks receive nothing). Each case is checked
against one process on the same seeded model and batch: loss-token count, loss, every gradient and every
weight after one AdamW step with clipping, max |diff| <= 1e-5 x max |ref|.
"""

import copy

import torch

from mimo.config.schema import Config
from mimo.data.batching import COUNTS
from mimo.models.build import build_model
from mimo.models.multimodal import modules_by_name
from mimo.models.step_hints import forward_args
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from mimo.parallel.plan import ParallelPlan
from mimo.train.optim import MimoOptimizer
from tests.support.dist import run_distributed
from tests.support.expert_case import moe_batch, moe_config, moe_prepare
from tests.support.parity import close, colocated_step, grads_then_step, step_matches_reference

RTOL = 1e-5


def _reference(cfg: Config, batch: dict, router: str) -> dict:
    torch.manual_seed(0)
    model = build_model(cfg.model)
    moe_prepare(model, router)
    model.train()
    out = model(**forward_args({k: v for k, v in batch.items() if k != COUNTS}))
    (out.loss_sum / out.num_tokens).backward()
    grads, params = grads_then_step(cfg, model)
    return {"tokens": out.num_tokens, "loss": (out.loss_sum / out.num_tokens).detach(), "grads": grads,
            "params": params}


def _run_case(rank: int, world: int, lm: dict, router: str, micro: int) -> float:
    what = f"lm {lm} router {router} micro {micro}"
    cfg = moe_config(lm, router, micro)
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world))
    batch = moe_batch()
    ref = _reference(cfg, copy.deepcopy(batch), router)
    torch.manual_seed(0)
    with torch.device("meta"):
        par = build_model(cfg.model)
    plan = ParallelPlan(cfg, rank, world)
    plan.parallelize(par)
    moe_prepare(par, router)
    par.train()
    held = {n: p.shape[0] for n, p in par.named_parameters() if n.endswith("w_gate")}
    assert all(e == 4 // lm["ep"] for e in held.values()), f"{what}: this rank holds {held} experts"
    if lm.get("fsdp"):  # experts sharded over their edp ranks, the router over the whole dp
        meshes = {n.split("mlp.")[1]: p.device_mesh.size() for n, p in par.language_model.named_parameters()
                  if "mlp." in n}
        assert meshes == {"router.weight": world, "w_gate": world // lm["ep"], "w_up": world // lm["ep"],
                          "w_down": world // lm["ep"]}, f"{what}: {meshes}"
    opt = MimoOptimizer(modules_by_name(par), cfg.optim, 10, norm_sq_reduce=plan.norm_sq_reduce)
    loss, tokens = colocated_step(plan, par, batch)
    assert tokens == ref["tokens"], what
    worst = close(f"{what} loss", loss, ref["loss"], RTOL)
    worst = max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))
    return worst


CASES = [
    (dict(ep=2), "softmax", 1),
    (dict(ep=4), "softmax", 2),
    (dict(ep=2), "all_to_one", 1),
    (dict(ep=4), "all_to_one", 1),
    (dict(ep=2, tp=2), "softmax", 1),
    (dict(ep=2, tp=2), "all_to_one", 2),
    (dict(ep=2, fsdp=True), "softmax", 2),
    (dict(ep=2, fsdp=True), "all_to_one", 1),
    (dict(ep=4, fsdp=True), "softmax", 1),
    (dict(ep=2, cp=2), "softmax", 1),
    (dict(ep=2, cp=2), "all_to_one", 2),
    (dict(ep=2, cp=2, fsdp=True), "plain", 1),
    (dict(ep=2, tp=2, sequence_parallel=True), "softmax", 1),
    (dict(ep=2, tp=2, sequence_parallel=True), "all_to_one", 1),
]


def _all_cases(rank: int, world: int) -> list[float]:
    return [_run_case(rank, world, lm, router, micro) for lm, router, micro in CASES]


def test_expert_parallel_equals_single_process():
    worst = run_distributed(_all_cases, 4, timeout=600)
    print("max relative diff per case (rank 0):", [f"{w:.2e}" for w in worst[0]])
