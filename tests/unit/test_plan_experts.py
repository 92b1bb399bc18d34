"""`mimo plan` on a mixture-of-experts LM: expert-parallel candidates that pass the gate, the experts' memory
split by ep (by hand), and the all-to-all and edp reduction in the predicted step (CPU, no processes)."""

from __future__ import annotations

import tomllib

from mimo.config.load import load_config
from mimo.config.schema import ModuleLayoutConfig
from mimo.parallel.layout import Layout
from mimo.planner.candidates import label, make_plan, to_toml, with_modules
from mimo.planner.memory import module_sizes
from mimo.train.gate import check_layout
from tests.support.plan_case import TINY, usage_of

# test_plan's TINY LM with a MoE feed-forward of 4 experts of width 16 on both layers:
#   per layer: attention 1024 + 512 + 512 + 1024 = 3072, norms 64, router 4 x 32 = 128 (TP-replicated),
#   experts 3 x 4 x 16 x 32 = 6144 (split by ep, not by tp);
#   total = 2048 + 2048 + 32 + 2 x (3072 + 64 + 128 + 6144) = 22944, of which 12288 in experts.
MOE = [*TINY, "--model.llm.moe_experts=4", "--model.llm.moe_mlp=16", "--model.llm.moe_top_k=2"]
PARAMS, EXPERTS = 22944, 12288
LM = "language"


def _lm(**kw) -> dict[str, ModuleLayoutConfig]:
    return {LM: ModuleLayoutConfig(**kw)}


def test_expert_memory_splits_by_ep_by_hand():
    cfg = load_config(None, MOE)
    size = module_sizes(cfg)[LM]
    assert size.params == PARAMS and size.experts == 16 * EXPERTS
    dp2 = usage_of(cfg, _lm(), 2)
    ep2 = usage_of(cfg, _lm(ep=2), 2)
    assert dp2.states == 16 * PARAMS
    # ep2: each rank holds 2 of the 4 experts, half the expert share; activations unchanged.
    assert ep2.states == 16 * (PARAMS - EXPERTS / 2)
    assert dp2.states - ep2.states == 16 * EXPERTS / 2 and ep2.activations == dp2.activations
    # tp2 splits attention, embedding and head (2 x 3072 + 2048 + 2048 = 10240), not the router or experts.
    assert usage_of(cfg, _lm(tp=2), 2).states == 16 * (10240 / 2 + 2 * (64 + 128) + 32 + EXPERTS)
    # FSDP over dp4: every state / 4, ep or not (ep2's experts are FSDP-sharded over their 2 edp ranks).
    assert usage_of(cfg, _lm(fsdp=True, ep=2), 4).states == usage_of(cfg, _lm(fsdp=True), 4).states == 16 * PARAMS / 4
    # master weights on dp4 ep2: dense 4 B + 12 B / 4 lanes; experts 4 B / 2 + 12 B / (2 edp x 2 ep).
    master = load_config(None, [*MOE, "--precision.master_weights=true"])
    assert usage_of(master, _lm(ep=2), 4).states == (PARAMS - EXPERTS) * (4 + 3) + EXPERTS * (2 + 3)


def test_plan_lists_expert_parallel_candidates_that_pass_the_gate():
    cfg = load_config("configs/demo_moe_vlm.toml")
    plan = make_plan(cfg, 4, 80)
    eps = {r.modules[LM].ep for r in plan.rows}
    assert eps == {1, 2, 4}, eps  # 4 experts, LM dp up to 4: ep 2 and 4 pass the gate
    for row in plan.rows:  # every row's printed TOML, read back as a config, passes the trainer's checks
        tables = tomllib.loads(to_toml(row.modules, cfg.parallel.microbatches, row.layout))["parallel"]
        modules = {n: ModuleLayoutConfig(**t) for n, t in tables["modules"].items()}
        assert modules[LM].ep == row.modules[LM].ep
        layout = Layout.from_config(modules, ["language", "images"], 4)
        check_layout(with_modules(cfg, modules), layout)
        assert layout.grids == row.layout.grids
    by_label = {label(r.layout, r.modules): r for r in plan.rows}
    one, two = by_label["dp4"], by_label["images dp4 | LM dp4 ep2"]
    assert "LM ep2" in two.why
    # The all-to-alls add communication; each rank then reduces and updates half the experts.
    assert two.prediction.comm_s > one.prediction.comm_s
    assert two.prediction.reduce_s < one.prediction.reduce_s
    expert = module_sizes(cfg)[LM].experts
    assert one.usage.states - two.usage.states == expert / 2


def test_a_dense_lm_gets_no_expert_candidates():
    plan = make_plan(load_config("configs/demo_vlm.toml"), 4, 80)
    assert {r.modules["language"].ep for r in plan.rows} == {1}
