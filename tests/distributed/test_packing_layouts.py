"""Packed rows on colocated layouts train exactly the unpacked samples in one process.

The global batch holds 24 padded samples of 3 to 16 tokens with 0, 1 or 2 images each (tests.support.documents);
packed by first fit into rows of 16 tokens, it has 16 rows. On 2 gloo ranks, every module colocated, each case
trains the packed batch: the LM tp2 with sequence parallel (the encoder's dp2 fans in), the LM cp2 with activation
checkpointing of both modules (each block recomputed in backward with this rank's packed-rows mask), the LM and
the encoder FSDP2 over dp2, and a mixture-of-experts LM with ep2 (its router losses off: they are per row, so the
gate refuses packing with them). Each is checked against one process on the UNPACKED
batch: the loss, every gradient and the weights after one AdamW step with clipping, max |diff| <= 1e-5 x
max |ref| (fp32). Packed cp2 without checkpointing (and cp2 x tp2, cp2 with FSDP) is in test_context_parallel.py,
pipelined layouts in test_pipeline_packing.py.
"""

import pytest
import torch
from torch.distributed._composable import checkpoint

from mimo.config.schema import Config, ConfigError, ModuleLayoutConfig
from mimo.config.validate import validate
from mimo.data.packing import pack_batch
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import validate_plan
from mimo.perf.apply import apply_fast_paths
from tests.support.configs import tiny_llm, tiny_vit, tiny_vlm
from tests.support.dist import run_distributed
from tests.support.documents import padded_samples
from tests.support.parity import (
    close,
    colocated_step,
    reference_and_parallel_copy,
    reference_step,
    step_matches_reference,
)

RTOL = 1e-5
PAD, IMG, S = 0, 60, 16
IMAGES_PER_SAMPLE = [0, 2, 1, 1, 2, 0, 1, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0, 1, 0, 0, 2, 0, 1, 0]
MOE = dict(moe_experts=4, moe_mlp=16, moe_top_k=2)
# (name, LM layout, microbatches, MoE LM, activation checkpointing)
CASES = [
    ("LM tp2 + sequence parallel", dict(tp=2, sequence_parallel=True), 2, False, False),
    ("LM cp2, activation checkpointing", dict(cp=2), 1, False, True),
    ("LM and encoder FSDP2 over dp2", dict(fsdp=True), 2, False, False),
    ("MoE LM ep2", dict(ep=2), 1, True, False),
]


def _config(lm: dict, micro: int, moe: bool, checkpointing: bool) -> Config:
    images = ModuleLayoutConfig(fsdp=bool(lm.get("fsdp")))
    cfg = tiny_vlm(tiny_llm(init_std=0.1, **(MOE if moe else {})), tiny_vit(init_std=0.1), IMG,
                   {"language": ModuleLayoutConfig(**lm), "images": images}, micro, len(IMAGES_PER_SAMPLE))
    cfg.data.packing, cfg.data.pack_length = True, S
    cfg.perf.activation_checkpointing = ["language", "images"] if checkpointing else []
    return cfg


def _run_case(rank: int, world: int, what: str, lm: dict, micro: int, moe: bool, checkpointing: bool) -> float:
    """One layout; returns (on rank 0) the worst relative difference of loss, gradients and weights."""
    cfg = _config(lm, micro, moe, checkpointing)
    validate(cfg)
    validate_plan(cfg, Layout.from_config(cfg.parallel.modules, cfg.model.module_names, world))
    batch = padded_samples(IMAGES_PER_SAMPLE, S, IMG, PAD)
    paths = (lambda model, runtime: apply_fast_paths(cfg, model, runtime)) if checkpointing else None
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world, lambda model: reference_step(cfg, batch, model),
                                                      paths)
    checkpointed = sum(checkpoint.state(block) is not None for block in par.modules())
    assert checkpointed == (3 if checkpointing else 0), f"{what}: {checkpointed} checkpointed blocks"
    packed, _ = pack_batch(batch, PAD, S, plan.batch_multiple())
    assert packed["input_ids"].shape[0] < batch["input_ids"].shape[0], what
    loss, _ = colocated_step(plan, par, packed)
    worst = close(f"{what} loss", loss, torch.tensor(ref["loss"]), RTOL)
    return max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))


def _all_cases(rank: int, world: int) -> list[float]:
    return [_run_case(rank, world, *case) for case in CASES]


def test_packed_colocated_layouts_equal_unpacked_single_process():
    worst = run_distributed(_all_cases, 2, timeout=300)[0]
    for (what, *_), w in zip(CASES, worst):
        print(f"{what}: max relative diff {w:.2e}")


@pytest.mark.parametrize("field", ["moe_aux_loss_weight", "moe_z_loss_weight"])
def test_packing_refuses_per_row_router_losses(field):
    cfg = _config(dict(ep=2), 1, True, False)
    setattr(cfg.model.llm, field, 0.01)
    with pytest.raises(ConfigError, match=rf"model.llm.{field} .* data.packing"):
        validate(cfg)
