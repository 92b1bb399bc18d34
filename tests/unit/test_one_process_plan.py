"""One process has a ParallelPlan too: every module whole on its one rank, no process group (torch.distributed
never initialised), parallel.modules unread, and every service the trainer asks of it the identity."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mimo.config.schema import LANGUAGE
from mimo.data.batching import split_microbatches
from mimo.hf.build import build_model
from mimo.models.init import whole
from mimo.models.multimodal import modules_by_name
from mimo.models.runtime import ModelRuntime
from mimo.parallel.decoding import whole_sequences
from mimo.parallel.plan import ParallelPlan
from mimo.tasks import build_demo_data
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
