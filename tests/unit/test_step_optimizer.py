"""The one optimizer protocol (`StepOptimizer`): both optimizers implement each of its methods, and the trainer's
step (begin, update or skip) runs through it alike. Against torch's own AdamW and the schedule by hand: after one
update both take the step a fresh AdamW takes at the schedule's learning rate; a skipped step changes nothing and
reports that learning rate."""

from __future__ import annotations

import math

import pytest
import torch

from mimo.config.schema import OptimConfig
from mimo.train.faults import skip_step
from mimo.train.master_optim import MasterOptimizer
from mimo.train.optim import MimoOptimizer, StepOptimizer, lr_factor

CFG = OptimConfig(lr=1e-2, warmup_steps=4, weight_decay=0.0, clip=0.0)
STEP = 2  # in the warm-up: the learning rate is 3/4 of optim.lr


def _model() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {"language": torch.nn.Linear(4, 3, bias=False)}


def _build(kind: str, modules: dict[str, torch.nn.Module]) -> StepOptimizer:
    if kind == "master":
        return MasterOptimizer(modules, CFG, total_steps=10)
    return MimoOptimizer(modules, CFG, total_steps=10)


@pytest.mark.parametrize("cls", [MimoOptimizer, MasterOptimizer])
def test_both_optimizers_implement_every_method_of_the_protocol(cls):
    assert StepOptimizer in cls.__mro__
    for name in ("begin", "step", "zero_grad", "master_state"):
        assert getattr(cls, name) is not getattr(StepOptimizer, name), (cls.__name__, name)


@pytest.mark.parametrize("kind", ["plain", "master"])
def test_a_step_through_the_protocol_updates_or_skips_like_torch_adamw(kind):
    modules = _model()
    start = modules["language"].weight.detach().float().clone()
    opt = _build(kind, modules)
    weight = modules["language"].weight
    before = weight.detach().clone()  # under master_weights: bf16, its fp32 master `start`
    x = torch.randn(5, 4, dtype=weight.dtype)

    opt.begin(STEP)
    modules["language"](x).square().sum().backward()
    stepped, norm, lr = skip_step(opt, STEP)
    assert (stepped, lr, weight.grad) == (False, CFG.lr * 3 / 4, None) and math.isnan(norm)
    assert torch.equal(weight.detach(), before)

    opt.begin(STEP)
    modules["language"](x).square().sum().backward()
    grad = weight.grad.detach().float().clone()
    stepped, norm, lr = opt.step(STEP)
    assert stepped and lr == lr_factor(STEP, 10, CFG) * CFG.lr == opt.lr(STEP)
    assert norm == pytest.approx(float(grad.norm()), rel=1e-6)
    ref = torch.nn.Parameter(start.clone())
    ref.grad = grad
    torch.optim.AdamW([ref], lr=lr, betas=(CFG.beta1, CFG.beta2), eps=CFG.eps, weight_decay=0.0).step()
    # master_weights: the fp32 master weights take the update (the bf16 weights are them rounded)
    got = opt.parts[0][1].master[:12].view(3, 4) if kind == "master" else weight.detach()
    torch.testing.assert_close(got, ref.detach(), rtol=1e-6, atol=1e-7)
