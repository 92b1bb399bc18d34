"""The mixture-of-experts LM in the rest of mimo: config checks, the meta build and per-name init, FLOPs,
and `mimo train`'s step (router losses in the objective, expert loads in metrics.jsonl, the sigmoid bias)."""

from __future__ import annotations

import pytest
import torch

from mimo.config.schema import ConfigError, LLMConfig, ModelConfig
from mimo.config.validate import validate
from mimo.models.build import build_model
from mimo.models.flops import lm_flops
from mimo.models.moe import MoEFeedForward, moe_layers
from mimo.train.router_loss import RouterLosses
from mimo.train.trainer import Trainer
from tests.support.configs import tiny_llm
from tests.support.tiny_run import metrics, tiny_config

MOE = ["--model.llm.moe_experts=4", "--model.llm.moe_mlp=32", "--model.llm.moe_top_k=2",
       "--model.llm.moe_aux_loss_weight=0.05", "--model.llm.moe_z_loss_weight=0.01", "--model.llm.layers=2"]


@pytest.mark.parametrize("override, field", [
    ("--model.llm.moe_mlp=0", "model.llm.moe_mlp"),
    ("--model.llm.moe_top_k=5", "model.llm.moe_top_k"),
    ("--model.llm.moe_gating=relu", "model.llm.moe_gating"),
    ("--model.llm.moe_bias_rate=0.01", "model.llm.moe_bias_rate"),
    ("--model.llm.moe_shared_gate=true", "model.llm.moe_shared_gate"),
    ("--model.llm.moe_dense_layers=[0,1]", "no layer is a mixture of experts"),
    ("--model.llm.moe_dense_layers=[7]", "model.llm.moe_dense_layers"),
    ("--model.llm.moe_aux_loss_weight=-1", "model.llm.moe_aux_loss_weight"),
    ("--perf.loss_rows_only=true", "perf.loss_rows_only"),
])
def test_bad_moe_configs_are_refused_naming_the_field(tmp_path, override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(tiny_config(tmp_path, *MOE, override))


def test_moe_on_every_other_layer_but_the_dense_ones():
    cfg = tiny_llm(layers=6, moe_experts=4, moe_mlp=8, moe_every=2, moe_dense_layers=[3])
    assert [cfg.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]


def test_meta_build_then_per_name_init_makes_the_experts_and_a_zero_bias():
    cfg = ModelConfig(llm=tiny_llm(moe_experts=4, moe_mlp=8, moe_gating="sigmoid", moe_shared_mlp=8,
                                   moe_shared_gate=True))
    torch.manual_seed(3)
    model = build_model(cfg)
    moe = model.language_model.layers["0"].mlp
    assert isinstance(moe, MoEFeedForward) and moe.w_gate.shape == (4, 8, 32) and moe.w_down.shape == (4, 32, 8)
    assert moe.w_up.std().item() == pytest.approx(0.02, rel=0.1)
    assert torch.equal(moe.expert_bias, torch.zeros(4))
    torch.manual_seed(3)
    again = build_model(cfg)
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name
    assert "language_model.layers.0.mlp.expert_bias" in model.state_dict()


def test_flops_count_the_active_experts_only():
    dense = tiny_llm(layers=2)
    moe = tiny_llm(layers=2, moe_experts=8, moe_top_k=2, moe_mlp=16, moe_every=2, moe_shared_mlp=8,
                   moe_shared_gate=True)
    h, seq = 32, 10
    per_token_moe = h * 8 + 2 * 3 * h * 16 + 3 * h * 8 + h  # router, 2 experts, shared expert and its gate
    assert lm_flops(moe, seq) - lm_flops(dense, seq) == 2 * seq * (per_token_moe - 3 * h * dense.mlp)
    assert isinstance(LLMConfig().is_moe_layer(0), bool)


def test_training_logs_each_layers_expert_load_and_the_router_losses(tmp_path):
    Trainer(tiny_config(tmp_path, *MOE, "--train.steps=3")).train()
    rows = [r for r in metrics(tmp_path) if "step" in r and "loss" in r]
    assert len(rows) == 3
    for r in rows:
        assert set(r["moe_load"]) == {"0", "1"}
        for shares in r["moe_load"].values():
            assert len(shares) == 4 and sum(shares) == pytest.approx(1.0, abs=1e-5)
        assert 0.9 < r["moe_aux_loss"] < 4.0 and r["moe_z_loss"] > 0


def test_microbatches_do_not_change_the_router_objective(tmp_path):
    """One process, the same global batch in one or two microbatches: the same losses, router terms included,
    over steps whose weights depend on the earlier steps' gradients."""
    runs = []
    for n in (1, 2):
        out = tmp_path / f"mb{n}"
        Trainer(tiny_config(out, *MOE, "--train.steps=3", f"--parallel.microbatches={n}")).train()
        runs.append([(r["loss"], r["moe_aux_loss"]) for r in metrics(out) if "moe_aux_loss" in r])
    assert len(runs[0]) == 3
    for (a, aux_a), (b, aux_b) in zip(*runs):
        assert a == pytest.approx(b, rel=1e-5) and aux_a == pytest.approx(aux_b, rel=1e-5)


def test_the_sigmoid_routers_bias_moves_toward_balance(tmp_path):
    trainer = Trainer(tiny_config(tmp_path, *MOE, "--train.steps=1", "--model.llm.moe_gating=sigmoid",
                                  "--model.llm.moe_bias_rate=0.01"))
    trainer.train()
    loads = trainer.router_losses.loads
    for moe, load in zip(moe_layers(trainer.model).values(), loads):
        want = 0.01 * torch.sign(load.mean() - load)
        assert torch.equal(moe.expert_bias, want) and want.abs().sum() > 0


@pytest.mark.parametrize("fast_path", [['--perf.activation_checkpointing=["language"]'],
                                       ["--perf.compile=true", "--perf.compile_backend=aot_eager"]])
def test_checkpointed_and_compiled_blocks_train_the_router_like_eager(tmp_path, fast_path):
    """A recompute in the backward records no second load, and the router losses' gradients survive both paths:
    the same losses and loads over steps whose weights depend on them."""
    runs = []
    for name, extra in (("eager", []), ("fast", fast_path)):
        Trainer(tiny_config(tmp_path / name, *MOE, "--train.steps=3", *extra)).train()
        runs.append([(r["loss"], r["moe_load"]) for r in metrics(tmp_path / name) if "moe_load" in r])
    assert len(runs[0]) == 3
    for (loss_a, load_a), (loss_b, load_b) in zip(*runs):
        assert loss_a == pytest.approx(loss_b, rel=1e-6) and load_a == load_b


def test_a_resumed_sigmoid_router_continues_bit_for_bit(tmp_path):
    """The balancing bias is in the checkpoint: resumed from step 3 of 5 (a nonzero bias: an odd number of moves),
    the run logs what the uninterrupted one does."""
    moving = [*MOE, "--model.llm.moe_gating=sigmoid", "--model.llm.moe_bias_rate=0.05", "--train.steps=5"]
    whole = Trainer(tiny_config(tmp_path / "whole", *moving, "--checkpoint.save_every=1", "--checkpoint.keep=9"))
    whole.train()
    step3 = tmp_path / "whole" / "tiny" / "checkpoints" / "step_00000003"
    Trainer(tiny_config(tmp_path / "resumed", *moving, f"--checkpoint.resume={step3}")).train()
    rows = [[(r["loss"], r["moe_load"]) for r in metrics(tmp_path / n) if "moe_load" in r and r["step"] >= 3]
            for n in ("whole", "resumed")]
    assert len(rows[0]) == 2 and rows[1] == rows[0]


def test_router_bookkeeping_finds_layers_inside_a_wrapper(tmp_path):
    """A block wrapped from outside (its MoE then named language_model.layers.1.<wrapper>.mlp) keeps its index."""
    cfg = tiny_config(tmp_path, *MOE)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    wrapper = torch.nn.Module()
    wrapper.wrapped = model.language_model.layers["1"]
    model.language_model.layers["1"] = wrapper
    router = RouterLosses(model, cfg)
    assert router.layers == {0: model.language_model.layers["0"].mlp, 1: wrapper.wrapped.mlp}
