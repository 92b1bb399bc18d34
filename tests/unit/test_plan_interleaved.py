"""`mimo plan` and interleaved 1F1B: the interleaved candidates it lists, their simulated bubble, their
activations in flight counted along the runtime's order against Megatron's hand formula, and their TOML
passing the gate (CPU, no processes)."""

from __future__ import annotations

import dataclasses

import pytest
import tomllib

from mimo.config.load import load_config
from mimo.config.schema import ModuleLayoutConfig
from mimo.planner.candidates import cost_at, label, layout_of, make_plan, to_toml, with_modules
from mimo.planner.memory import estimate, in_flight, interleaved_in_flight, module_sizes
from mimo.planner.network import Network
from mimo.planner.predict import Setting
from mimo.planner.profile import shipped_profile

# demo_vlm with a 12-layer LM: pp2 x v2 and pp3 x v2 cut it into equal chunks.
DEMO = ["--model.llm.layers=12", "--parallel.microbatches=6", "--data.global_batch=24"]


def _modules(pp: int, v: int) -> dict[str, ModuleLayoutConfig]:
    """images dp on ranks 0..e-1, the LM pp x dp2 on the other 8 - e ranks."""
    enc = 8 - 2 * pp
    return {"images": ModuleLayoutConfig(offset=0, size=enc),
            "language": ModuleLayoutConfig(offset=enc, size=8 - enc, pp=pp, virtual_stages=v)}


@pytest.mark.parametrize("pp,chunks,micro", [(2, 2, 4), (4, 2, 8), (2, 4, 8), (4, 4, 4)])
def test_in_flight_count_follows_the_runtimes_order_and_megatrons_formula(pp, chunks, micro):
    """Rank r holds 2 (pp - r - 1) + (chunks - 1) pp warm-up chunk forwards plus the steady phase's one, at
    most every chunk of every microbatch: pp2 x v2 over 4 microbatches gives rank 0 five, rank 1 three."""
    for r in range(pp):
        assert interleaved_in_flight(r, pp, chunks, micro) == min(2 * (pp - r - 1) + (chunks - 1) * pp + 1,
                                                                 chunks * micro)
    if (pp, chunks, micro) == (2, 2, 4):
        assert [interleaved_in_flight(r, 2, 2, 4) for r in range(2)] == [5, 3]


def test_interleaved_stages_hold_more_microbatches_than_1f1b():
    """images dp4 on ranks 0-3 feeding an LM pp2 dp2 at 6 microbatches: under 1F1B the encoder (3 stages deep
    counting the LM's) holds 3 microbatches, LM rank 0 two, rank 1 one; interleaved over 2 chunks LM rank 0
    holds 2 x 1 + 1 x 2 + 1 = 5 chunks (2.5 microbatches of its layers), rank 1 3 (1.5), and the encoder its
    warm-up before that LM (feeder_lead = 4, so 4 + 1 = 5) -- the estimate's activations grow with it."""
    cfg = load_config("configs/demo_vlm.toml", DEMO)
    plain, inter = _modules(2, 1), _modules(2, 2)
    lay1, lay2 = layout_of(cfg, plain, 8), layout_of(cfg, inter, 8)
    assert lay1 is not None and lay2 is not None
    inter_cfg = with_modules(cfg, inter)
    assert [in_flight(cfg, lay1, "language", r) for r in range(2)] == [2, 1]
    assert [in_flight(inter_cfg, lay2, "language", r) for r in range(2)] == [2.5, 1.5]
    assert (in_flight(cfg, lay1, "images", 0), in_flight(inter_cfg, lay2, "images", 0)) == (3, 5)
    sizes = module_sizes(cfg)
    assert estimate(inter_cfg, lay2, sizes, inter).activations > estimate(cfg, lay1, sizes, plain).activations


@pytest.mark.parametrize("pp", [2, 3])
def test_a_v2_row_has_the_smaller_predicted_bubble(pp):
    """The same layout with virtual_stages = 2: the simulated bubble is about half of 1F1B's ((pp - 1) / (v m)
    against (pp - 1) / m of the step; the encoder's stage and the extra messages keep it from exactly half)."""
    cfg = load_config("configs/demo_vlm.toml", DEMO)
    setting = Setting(cfg, module_sizes(cfg), shipped_profile(cfg.train.device), Network())
    one, two = (cost_at(setting, _modules(pp, v), 6, 8, 80.0) for v in (1, 2))
    assert one is not None and two is not None
    assert 0 < two.prediction.bubble_s < 0.75 * one.prediction.bubble_s
    assert label(two.layout, two.modules).endswith(f"pp{pp} v2 dp2")
    assert "interleaved over 2 model chunks" in two.why


def test_the_plan_lists_interleaved_rows_whose_toml_passes_the_gate():
    """A pipelined split of demo_vlm (12 layers, 6 microbatches) at 8 GPUs comes again with v = 2; every row's
    printed TOML, read back, is a layout the gate accepts, the same one the row was costed on."""
    cfg = load_config("configs/demo_vlm.toml", DEMO)
    plan = make_plan(cfg, 8, 80.0)
    interleaved = [r for r in plan.rows if r.modules["language"].virtual_stages == 2]
    assert interleaved, [label(r.layout, r.modules) for r in plan.rows]
    for row in plan.rows:
        text = to_toml(row.modules, row.microbatches, row.layout)
        parsed = tomllib.loads(text)["parallel"]
        modules = {n: ModuleLayoutConfig(**m) for n, m in parsed["modules"].items()}
        at = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, microbatches=parsed["microbatches"]))
        layout = layout_of(at, modules, 8)
        assert layout is not None and layout.grids == row.layout.grids, text
        assert modules["language"].virtual_stages == row.modules["language"].virtual_stages
    assert all("virtual_stages = 2" in to_toml(r.modules, r.microbatches, r.layout) for r in interleaved)


def test_no_interleaved_row_where_the_gate_refuses_it():
    """The shipped demo_vlm (3 layers) cannot cut pp2 x v2 = 4 chunks: no row interleaves."""
    plan = make_plan(load_config("configs/demo_vlm.toml"), 8, 80.0)
    assert all(r.modules["language"].virtual_stages == 1 for r in plan.rows)
