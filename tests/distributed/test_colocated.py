"""Colocated heterogeneous layouts equal single-process training, tensor by tensor.

The encoder and the LM share all ranks with different TP/DP. On 8 ranks, fan-in: encoder tp2 x dp4,
LM tp4 x dp2; fan-out: encoder tp4 x dp2, LM tp2 x dp4. On 2 ranks (the widest a 2-GPU machine runs
on NCCL), fan-in: encoder dp2, LM tp2; fan-out: encoder tp2, LM dp2. Samples hold 0, 1 or 2 images, so rows per sample
vary and some encoder lanes get no image at all. Checked against a single-process run of the same
seeded model on the same global batch: the LM's input embeddings after the bridge, the logits, every
gradient, and the weights after one AdamW step with clipping, max |diff| <= 1e-5 x max |ref|.
"""

import math

import pytest
import torch

from mimo.config.schema import (
    Config,
    ModuleLayoutConfig,
)
from mimo.data.batching import COUNTS
from mimo.models.build import build_model
from mimo.models.multimodal import modules_by_name
from mimo.models.step_hints import forward_args
from mimo.parallel.plan import ParallelPlan
from mimo.train.optim import MimoOptimizer
from tests.support.configs import tiny_llm, tiny_vit, tiny_vlm
from tests.support.dist import run_distributed
from tests.support.parity import close, grads_then_step, reference_and_parallel_copy, step_matches_reference

RTOL = 1e-5
IMG, S, TOKENS_PER_IMAGE = 60, 16, 4
IMAGES_PER_SAMPLE = [0, 0, 2, 1, 1, 2, 0, 1]


def _config(enc_tp: int, lm_tp: int, micro: int) -> Config:
    return tiny_vlm(tiny_llm(kv_heads=4, init_std=0.1), tiny_vit(init_std=0.1), IMG,
                    {"language": ModuleLayoutConfig(tp=lm_tp), "images": ModuleLayoutConfig(tp=enc_tp)}, micro,
                    8 * micro)


def _batch(micro: int, asymmetric: bool) -> dict:
    g = torch.Generator().manual_seed(7)
    n = 8 * micro
    counts = torch.tensor(IMAGES_PER_SAMPLE * micro)
    ids = torch.randint(1, 50, (n, S), generator=g)
    labels = torch.full((n, S), -100)
    for s in range(n):
        k = int(counts[s]) * TOKENS_PER_IMAGE
        ids[s, 1 : 1 + k] = IMG
        text = list(range(1 + k, S))
        if asymmetric:
            i, j = divmod(s, 8)
            text = text[: len(text) - ((7 * i + 3 * j) % (len(text) - 1)) - 1]
        labels[s, text] = torch.randint(1, 50, (len(text),), generator=g)
    pixels = torch.randn(int(counts.sum()), 3, 8, 8, generator=g)
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(S).expand(n, S).contiguous(),
            "modality_inputs": {"images": {"vit": {"pixel_values": pixels}}}, COUNTS: {"images": counts}}


def _reference(cfg: Config, batch: dict, model) -> dict:
    """Single process: embeddings and logits of the whole batch, then one step on the full batch."""
    with torch.no_grad():
        embeds = model.combined_embeddings(batch["input_ids"], batch["modality_inputs"])
        logits = model(batch["input_ids"], modality_inputs=batch["modality_inputs"]).logits
    out = model(batch["input_ids"], labels=batch["labels"], modality_inputs=batch["modality_inputs"])
    (out.loss_sum / out.num_tokens).backward()
    grads, params = grads_then_step(cfg, model)
    return {"embeds": embeds, "logits": logits, "tokens": out.num_tokens, "grads": grads, "params": params}


def _run_case(rank: int, world: int, enc_tp: int, lm_tp: int, micro: int, asymmetric: bool) -> None:
    what = f"world {world} enc tp{enc_tp} lm tp{lm_tp} micro {micro} asym {asymmetric}"
    cfg = _config(enc_tp, lm_tp, micro)
    batch = _batch(micro, asymmetric)
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world, lambda model: _reference(cfg, batch, model))
    seen = []
    hook = par.language_model.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    micro_batches = plan.microbatches(batch)
    lane, lanes = plan.dp_rank("language"), plan.dp("language")
    per_mb, lane_n = 8, 8 // lanes
    tokens = sum((mb["labels"] != -100).sum() for mb in micro_batches).float()
    n_global = plan.all_reduce_lm_data(tokens.clone())
    assert n_global == ref["tokens"], what
    for t, mb in enumerate(micro_batches):
        rows = slice(t * per_mb + lane * lane_n, t * per_mb + (lane + 1) * lane_n)
        with torch.no_grad():
            logits = par(**forward_args({k: v for k, v in mb.items() if k != "labels"})).logits
        close(f"{what} logits mb{t}", logits, ref["logits"][rows], RTOL)
        close(f"{what} embeddings after the bridge mb{t}", seen[-1], ref["embeds"][rows], RTOL)
        (par(**forward_args(mb)).loss_sum / n_global).backward()
    hook.remove()
    step_matches_reference(what, rank, plan, par, opt, ref, RTOL)


# (encoder tp, LM tp) by world size: fan-in, then fan-out
TP_PAIRS = {2: ((1, 2), (2, 1)), 8: ((2, 4), (4, 2))}


def _all_cases(rank: int, world: int) -> None:
    for enc_tp, lm_tp in TP_PAIRS[world]:
        for micro in (1, 4):
            for asymmetric in (False, True):
                _run_case(rank, world, enc_tp, lm_tp, micro, asymmetric)


@pytest.mark.parametrize("world", sorted(TP_PAIRS))
def test_colocated_fan_in_and_fan_out_equal_single_process(world: int):
    run_distributed(_all_cases, world, timeout=600)


def _inf_case(rank: int, world: int) -> None:
    cfg = _config(2, 4, 1)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    plan = ParallelPlan(cfg, rank, 8)
    plan.parallelize(model)
    opt = MimoOptimizer(modules_by_name(model), cfg.optim, 10, norm_sq_reduce=plan.norm_sq_reduce)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    (mb,) = plan.microbatches(_batch(1, False))
    model(**forward_args(mb)).loss_sum.backward()
    plan.finalize_grads(model)
    if rank == 3:
        next(model.modality_submodules["images"].parameters()).grad.view(-1)[0] = float("inf")
    stepped, norm, _ = opt.step(0)
    assert not stepped and not math.isfinite(norm), (stepped, norm)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n


def test_inf_in_one_module_on_one_rank_skips_the_step_everywhere():
    run_distributed(_inf_case, 8, timeout=300)
