"""Data parallelism (replicated and FSDP2) reproduces single-process gradients and the optimizer step.

Every rank builds the same seeded model and a single-process reference copy. The reference runs the
whole global batch; each DP rank runs its contiguous slice in two microbatches with the loss sum
scaled by 1/N_global. After reduction, every gradient and every weight after one clipped AdamW step
must match the reference. The batches mix image and text-only samples, different loss-token counts
per sample and rank, ranks whose whole share is text-only or has no loss tokens, and a batch without
any image (the encoder then has no gradient, as in single-process training).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.distributed as dist

from mimo.config.schema import ModalityConfig, ModelConfig, OptimConfig, ViTConfig
from mimo.models.build import build_model
from mimo.models.loss import loss_weights
from mimo.models.multimodal import MimoModel, modules_by_name
from mimo.models.step_hints import forward_args
from mimo.parallel.data import REPLICAS, AbsentInputFiller, GradReducer, apply_fsdp, norm_sq_reducer
from mimo.parallel.grid import Grid, GridGroups
from mimo.perf.apply import transformer_blocks
from mimo.perf.fused_qkv import fuse_qkv
from mimo.perf.regional import checkpoint_blocks
from mimo.train.optim import MimoOptimizer
from tests.support.configs import tiny_llm
from tests.support.dist import run_distributed

IMG = 70
SEQ = 10
# vocab 78 and the ViT's 5 position rows do not divide by 2 or 4: FSDP pads those shards
CFG = ModelConfig(llm=tiny_llm(vocab=78, mlp=48, init_std=0.2),
                  modalities={"images": ModalityConfig(token_id=IMG, vit=ViTConfig(image=16, patch=8, hidden=16,
                                                                                   heads=2, mlp=24))})
DUMMY = {"images": {"vit": {"pixel_values": torch.zeros(1, 3, 16, 16)}}}
MODULES = ["language", "images"]
MODES = ("replicated", "fsdp", "fsdp_empty_batch", "fsdp_fused_qkv", "fsdp_checkpointed")
"""fsdp: text-only microbatches leave modality_inputs out (AbsentInputFiller runs a dummy image);
fsdp_empty_batch: they pass 0 images, which joins FSDP's collectives by itself; fsdp_fused_qkv: fsdp with
each attention's q, k and v from one product (mimo.perf.fuse_qkv, against the unfused reference);
fsdp_checkpointed: fsdp with every LM and ViT block checkpointed, applied after sharding as `mimo train`
does (`perf.activation_checkpointing`)."""
ATOL = 1e-10
"""Gradients that are mathematically zero (attention key biases: softmax ignores a shift shared by all
keys) hold only rounding noise, ~1e-12 here, which no relative bound can compare."""
# (has image, loss tokens) per sample of the global batch of 8. On 2 ranks (4 samples each, 2 microbatches):
# rank 1's first microbatch is text-only and its second has no loss tokens; rank 0 of "early_text_only"
# never sees an image. On 4 ranks (2 samples each): rank 2 is text-only and rank 3 has no loss tokens;
# ranks 0-1 of "early_text_only" are text-only, rank 0 also without loss tokens.
SCENARIOS = {
    "late_text_only_and_zero_tokens": ([1, 1, 1, 1, 0, 0, 1, 1], [3, 7, 1, 5, 2, 9, 0, 0]),
    "early_text_only": ([0, 0, 0, 0, 1, 0, 0, 1], [0, 0, 4, 2, 6, 1, 3, 8]),
    "no_image_at_all": ([0] * 8, [2, 5, 0, 3, 7, 1, 4, 6]),
}


def make_samples(images: list[int], tokens: list[int], seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for has_image, n in zip(images, tokens):
        ids = torch.randint(0, IMG, (SEQ,), generator=g)
        labels = torch.full((SEQ,), -100)
        labels[torch.randperm(SEQ, generator=g)[:n]] = torch.randint(0, 78, (n,), generator=g)
        pixels = None
        if has_image:
            ids[1:5] = IMG
            pixels = torch.randn(1, 3, 16, 16, generator=g)
        samples.append({"input_ids": ids, "labels": labels, "pixels": pixels})
    return samples


def collate(samples: list[dict], empty_batch: bool = False) -> dict:
    """A microbatch. Without images it is text-only: no placeholders, and no modality_inputs, or with
    `empty_batch` an input of 0 images."""
    batch = {"input_ids": torch.stack([s["input_ids"] for s in samples]),
             "labels": torch.stack([s["labels"] for s in samples])}
    pixels = [s["pixels"] for s in samples if s["pixels"] is not None]
    if pixels or empty_batch:
        pixel_values = torch.cat(pixels) if pixels else torch.zeros(0, 3, 16, 16)
        batch["modality_inputs"] = {"images": {"vit": {"pixel_values": pixel_values}}}
    return batch


def run_step(model: MimoModel, micro: list[dict], group: dist.ProcessGroup | None) -> None:
    """Per-token loss protocol: every loss sum scaled by 1/N_global before backward."""
    n_global = sum(loss_weights(mb["labels"], None).sum() for mb in micro)
    if group is not None:
        dist.all_reduce(n_global, group=group)
    for mb in micro:
        (model(**forward_args(mb)).loss_sum / n_global.clamp_min(1.0)).backward()


def full(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.full_tensor() if t is not None and hasattr(t, "full_tensor") else t


def assert_close(what: str, got: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """max |diff| <= 1e-5 x max |ref| (+ ATOL); returns the fraction of that bound used."""
    assert (got is None) == (ref is None), f"{what}: has a gradient: {got is not None}, reference: {ref is not None}"
    if ref is None:
        return 0.0
    err = float((got - ref).abs().max())
    scale = float(ref.abs().max())
    bound = 1e-5 * scale + ATOL
    assert err <= bound, f"{what}: max |diff| {err:.3e} > 1e-5 x max |ref| {scale:.3e}"
    return err / bound


def check_case(rank: int, world: int, mode: str, scenario: str, groups: GridGroups) -> float:
    """One DP step against the reference; returns the largest fraction of the tolerance used."""
    group, mesh = groups.group("dp"), groups.device_mesh("dp")
    torch.manual_seed(0)
    model = build_model(CFG)
    ref = copy.deepcopy(model)
    samples = make_samples(*SCENARIOS[scenario], seed=len(scenario))

    run_step(ref, [collate(samples)], None)
    ref_grads = {n: None if p.grad is None else p.grad.clone() for n, p in ref.named_parameters()}
    # Adam's first step is lr * g / (|g| + eps): with a tiny eps it is lr * sign(g), which would blow
    # rounding noise in near-zero gradients up to +-lr and hide the gradient values; eps 1e-2 keeps the
    # update sensitive to the values and to the clip factor
    base = OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant", weight_decay=0.1, eps=1e-2)
    ref_norm = float(MimoOptimizer(modules_by_name(ref), base, 1).grad_norm())
    cfg = dataclasses.replace(base, clip=0.5 * ref_norm)
    ref_opt = MimoOptimizer(modules_by_name(ref), cfg, 1)
    assert ref_opt.step(0)[:2] == (True, ref_norm)

    if mode == "fsdp_fused_qkv":
        assert fuse_qkv(model) == CFG.llm.layers + CFG.modalities["images"].vit.layers
    if mode.startswith("fsdp"):
        apply_fsdp(model.language_model, mesh, entry_methods=("embed", "logits"))
        apply_fsdp(model.modality_submodules["images"], mesh)
        filler = AbsentInputFiller(model, DUMMY)
    else:
        reducers = [GradReducer(m, group, bucket_mb=0.004) for m in modules_by_name(model).values()]
        assert all(len(r.buckets) > 1 for r in reducers)
        assert all(getattr(p, REPLICAS) == world for p in model.parameters())
    if mode == "fsdp_checkpointed":
        for name in MODULES:
            checkpoint_blocks(transformer_blocks(model, name))
    per = len(samples) // world
    mine = samples[rank * per:(rank + 1) * per]
    half = len(mine) // 2
    empty = mode == "fsdp_empty_batch"
    run_step(model, [collate(mine[:half], empty), collate(mine[half:], empty)], group)
    if mode.startswith("fsdp"):
        filler.finish({"images": group})
    else:
        for r in reducers:
            r.reduce()

    worst = 0.0
    for name, p in model.named_parameters():
        worst = max(worst, assert_close(f"{mode}/{scenario} grad {name}", full(p.grad), ref_grads[name]))
    opt = MimoOptimizer(modules_by_name(model), cfg, 1, norm_sq_reduce=norm_sq_reducer(MODULES))
    stepped, norm, _ = opt.step(0)
    assert stepped and abs(norm - ref_norm) <= 1e-5 * ref_norm, f"{mode}/{scenario}: norm {norm} vs {ref_norm}"
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        worst = max(worst, assert_close(f"{mode}/{scenario} weight {name}", full(p.detach()),
                                        ref_params[name].detach()))
    return worst


def check_norm_reducer_disjoint(rank: int) -> None:
    """Modules on disjoint ranks (a: 0-1, b: 2-3): one slot each, every rank gets the same total,
    a rank holding nothing trainable still joins, and a NaN share reaches every rank."""
    reduce = norm_sq_reducer(["a", "b"])
    parts = {} if rank == 3 else {("a" if rank < 2 else "b"): torch.tensor(float(rank + 1))}
    assert float(reduce(parts)) == 6.0
    nan = {("a" if rank < 2 else "b"): torch.tensor(float("nan") if rank == 2 else 1.0)}
    assert torch.isnan(reduce(nan))


def _all_cases(rank: int, world: int, modes: tuple[str, ...]) -> dict[str, float]:
    """Every case in one process group: spawning ranks costs more than a case."""
    groups = Grid(dp=world).build("dp")
    if world == 4:
        check_norm_reducer_disjoint(rank)
    return {f"{mode}/{s}": check_case(rank, world, mode, s, groups) for mode in modes for s in SCENARIOS}


def test_data_parallel_matches_single_process_2_ranks():
    worst = run_distributed(_all_cases, 2, MODES, timeout=150)
    assert len(worst[0]) == len(MODES) * len(SCENARIOS)


def test_data_parallel_matches_single_process_4_ranks():
    modes = ("replicated", "fsdp")
    worst = run_distributed(_all_cases, 4, modes, timeout=150)
    assert len(worst[0]) == len(modes) * len(SCENARIOS)
