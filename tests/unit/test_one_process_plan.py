"""One process has a ParallelPlan too: every module whole on its one rank, no process group (torch.distributed
never initialised), parallel.modules unread, and every service the trainer asks of it the identity."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mimo.config.schema import LANGUAGE
from mimo.data.batching import split_microbatches
from mimo.hf.build import build_model
from mimo.models.init import whole
from mimo.models.loss import loss_weights
from mimo.models.multimodal import modules_by_name
from mimo.models.runtime import ModelRuntime
from mimo.models.step_hints import forward_args
from mimo.parallel.decoding import whole_sequences
from mimo.parallel.plan import ParallelPlan
from mimo.tasks import build_demo_data
from mimo.train.trainer import Trainer
from tests.support.parity import trainer_steps
from tests.support.tiny_run import tiny_config

# a layout over several ranks, which one process leaves unread as the gate does
LAYOUT = ["--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true",
          "--parallel.modules.images.fsdp=true", "--parallel.microbatches=2"]


def test_the_plan_of_one_process_has_no_groups_and_cuts_nothing(tmp_path):
    plan = ParallelPlan(tiny_config(tmp_path, *LAYOUT))
    assert not dist.is_initialized()
    assert plan.pipeline is None and plan.context is None and plan.norm_sq_reduce is None
    for name, grid in plan.layout.grids.items():
        assert (grid.size, plan.groups[name].group(), plan.groups[name].size_of()) == (1, None, 1), name
    assert plan.lm_tensor_parallel() is None and plan.expert_mesh() is None and plan.fsdp_modules() == []
    assert plan.master_state_groups(LANGUAGE) == [] and plan.agree_on_data() is None
    assert (plan.batch_multiple(), plan.data_lanes(), plan.decodes_in_place()) == (2, 1, True)
    plan.barrier()


def test_its_services_are_identities(tmp_path):
    cfg = tiny_config(tmp_path, *LAYOUT)
    plan = ParallelPlan(cfg)
    torch.manual_seed(cfg.train.seed)
    reference = build_model(cfg.model, load_weights=False)
    with torch.device("meta"):
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, load_weights=False)
    plan.parallelize(model)
    assert plan.local_view(model) is whole and model.runtime == ModelRuntime()
    ref, got = reference.state_dict(), model.state_dict()
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)

    batch = build_demo_data(cfg, model).global_batch(0, cfg.data.global_batch, cfg.data.seed)
    mine, plain = plan.microbatches(batch), split_microbatches(batch, cfg.parallel.microbatches)
    assert len(mine) == len(plain) == 2
    for a, b in zip(mine, plain):
        assert a.keys() == b.keys() and torch.equal(a["input_ids"], b["input_ids"])

    t = torch.tensor([1.5, 2.0])
    assert plan.all_reduce_lm_data(t) is t and plan.all_reduce_lm_lanes(t) is t and t.tolist() == [1.5, 2.0]
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    plan.finalize_grads(model)
    assert all(torch.equal(p.grad, torch.full_like(p, 0.25)) for p in model.parameters())
    full = plan.gather_full(model)
    assert all(torch.equal(full[k], got[k]) for k in got if k in full) and full.keys() == dict(
        model.named_parameters()).keys()
    with whole_sequences(plan, model):
        assert model.runtime == ModelRuntime()
    assert set(modules_by_name(model)) == set(plan.layout.grids)


def test_a_one_process_step_is_plain_pytorch(tmp_path):
    """The trainer's step on one process (laid out, split and reduced by its plan) against a plain loop on the
    same global batch: the single-device model, microbatches cut in order, each loss sum over the batch's loss
    tokens, one backward each. Loss and every gradient the optimizer gets within 1e-6 relative (fp32)."""
    cfg = tiny_config(tmp_path, "--parallel.microbatches=2", *LAYOUT[:3])
    trainer = Trainer(cfg)
    losses, grads = trainer_steps(trainer, 1)

    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, load_weights=False)
    batch = build_demo_data(cfg, model).global_batch(0, cfg.data.global_batch, cfg.data.seed)
    micro = split_microbatches(batch, cfg.parallel.microbatches)
    tokens = sum(loss_weights(mb["labels"], mb.get("loss_mask")).sum() for mb in micro)
    total = torch.zeros(())
    for mb in micro:
        out = model(**forward_args(mb))
        (out.loss_sum * (1.0 / tokens)).backward()
        total += out.loss_sum.detach()
    assert abs(losses[0] - float(total / tokens)) <= 1e-6 * abs(losses[0])
    want = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}
    assert grads[0].keys() == want.keys()
    for name, g in grads[0].items():
        assert (g - want[name]).abs().max() <= 1e-6 * want[name].abs().max(), name
