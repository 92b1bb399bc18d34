"""Context parallel (with and without TP=2 + sequence parallel, packed or not) equals single-process training.

All cases run in one spawn of 8 gloo ranks, every module colocated on all of them: the LM with cp 2 or 4
(x tp2 with sequence parallel), the encoder with its own TP/DP so its bridge fans in, fans out or is
the identity. Samples have different lengths and hold 0, 1 or 2 images. Each case is checked against a
single-process, unpacked run of the same seeded model on the same samples: loss-token count, loss,
CP-local logits (unpacked), every gradient and every weight after one AdamW step with clipping,
max |diff| <= 1e-5 x max |ref|. Packed cases pack the same samples into rows of 32 tokens.
"""


import pytest
import torch

from mimo.config.schema import Config
from mimo.data.batching import COUNTS
from mimo.data.packing import pack_batch
from mimo.models.loss import loss_weights
from mimo.models.step_hints import forward_args
from mimo.parallel.plan import ParallelPlan
from tests.support.cp_case import IMG, PACK, PAD, TOKENS_PER_IMAGE, N, S, cp_config
from tests.support.dist import run_distributed
from tests.support.parity import close, grads_then_step, reference_and_parallel_copy, step_matches_reference

RTOL = 1e-5
IMAGES = [0, 2, 1, 1, 0, 2, 1, 0, 1, 2, 0, 1, 1, 0, 2, 1]
LENGTHS = [7, 16, 9, 12, 5, 11, 16, 3, 8, 13, 6, 10, 14, 4, 9, 7]


def _batch() -> dict:
    """Padded samples of different lengths: <bos> <image>*4k text, labels on the text, PAD after."""
    g = torch.Generator().manual_seed(7)
    ids = torch.full((N, S), PAD)
    labels = torch.full((N, S), -100)
    for i, (k, n) in enumerate(zip(IMAGES, LENGTHS)):
        start = 1 + k * TOKENS_PER_IMAGE
        n = max(n, start + 2)
        ids[i, :n] = torch.randint(1, 50, (n,), generator=g)
        ids[i, 1:start] = IMG
        labels[i, start - 1:n - 1] = torch.randint(1, 50, (n - start,), generator=g)
    counts = torch.tensor(IMAGES)
    pixels = torch.randn(int(counts.sum()), 3, 8, 8, generator=g)
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(S).expand(N, S).contiguous(),
            "modality_inputs": {"images": {"vit": {"pixel_values": pixels}}}, COUNTS: {"images": counts}}


def _reference(cfg: Config, batch: dict, model) -> dict:
    """Single process, unpacked: logits, then loss and one optimizer step on the whole batch."""
    kwargs = {k: batch[k] for k in ("input_ids", "position_ids", "modality_inputs")}
    with torch.no_grad():
        logits = model(**forward_args(kwargs)).logits
    out = model(**forward_args(kwargs), labels=batch["labels"])
    (out.loss_sum / out.num_tokens).backward()
    grads, params = grads_then_step(cfg, model)
    return {"logits": logits, "tokens": out.num_tokens, "loss": (out.loss_sum / out.num_tokens).detach(),
            "grads": grads, "params": params}


def _run_case(rank: int, world: int, lm: dict, enc_tp: int, micro: int, packed: bool, tie: bool) -> float:
    what = f"world {world} lm {lm} enc tp{enc_tp} micro {micro} packed {packed} tied {tie}"
    cfg = cp_config(lm, enc_tp, micro, tie)
    batch = _batch()
    ref, plan, par, opt = reference_and_parallel_copy(cfg, rank, world, lambda model: _reference(cfg, batch, model))
    data = pack_batch(batch, PAD, PACK, plan.batch_multiple())[0] if packed else batch
    micro_batches = plan.microbatches(data)
    tokens = sum(loss_weights(mb["labels"], mb.get("loss_mask")).sum() for mb in micro_batches)
    n_global = plan.all_reduce_lm_data(tokens.clone())
    assert n_global == ref["tokens"], what
    worst, loss = 0.0, torch.zeros(())
    lane, per_mb = plan.dp_rank("language"), N // micro
    lane_n = per_mb // plan.dp("language")
    for t, mb in enumerate(micro_batches):
        if not packed:
            rows = slice(t * per_mb + lane * lane_n, t * per_mb + (lane + 1) * lane_n)
            local = plan.context.local_index(S)
            with torch.no_grad():
                logits = par(**forward_args({k: v for k, v in mb.items() if k != "labels"})).logits
            worst = max(worst, close(f"{what} logits mb{t}", logits, ref["logits"][rows][:, local], RTOL))
        out = par(**forward_args(mb))
        (out.loss_sum / n_global).backward()
        loss += out.loss_sum.detach()
    worst = max(worst, close(f"{what} loss", plan.all_reduce_lm_data(loss) / n_global, ref["loss"], RTOL))
    worst = max(worst, step_matches_reference(what, rank, plan, par, opt, ref, RTOL))
    return worst


# (LM layout, encoder tp, microbatches, tied embeddings) by world size; the bridge direction follows from
# the DP degrees. 2 ranks is the widest a 2-GPU machine runs on NCCL.
CASES = {2: [
    (dict(cp=2), 1, 2, True),                                   # LM dp1, encoder dp2: fan-in
    (dict(cp=2), 2, 1, False),                                  # LM dp1, encoder dp1: identity bridge
    (dict(cp=2, fsdp=True), 1, 1, False),                       # LM FSDP over cp
], 8: [
    (dict(cp=2), 1, 1, False),                                  # LM dp4, encoder dp8: fan-in
    (dict(cp=2), 4, 2, True),                                   # LM dp4, encoder dp2: fan-out
    (dict(cp=2), 2, 1, False),                                  # LM dp4, encoder dp4: identity bridge
    (dict(cp=4), 2, 1, True),                                   # LM dp2, encoder dp4: fan-in
    (dict(cp=2, tp=2, sequence_parallel=True), 2, 2, False),    # LM dp2, encoder dp4: fan-in
    (dict(cp=4, tp=2, sequence_parallel=True), 4, 1, False),    # LM dp1, encoder dp2: fan-in
    (dict(cp=2, fsdp=True), 2, 1, False),                       # LM FSDP over cp x dp
]}


def _all_cases(rank: int, world: int) -> list[float]:
    worst = [_run_case(rank, world, lm, enc_tp, micro, packed, tie)
             for lm, enc_tp, micro, tie in CASES[world] for packed in (False, True)]
    if world != 8:
        return worst
    # A sequence length CP x SP cannot split fails on every rank before any collective.
    plan = ParallelPlan(cp_config(dict(cp=4, tp=2, sequence_parallel=True), 4, 1), rank, world)
    bad = {k: v[:, :12] if k in ("input_ids", "labels", "position_ids") else v for k, v in _batch().items()}
    with pytest.raises(ValueError, match=r"divisible by 2 x cp x tp = 2 x 4 x 2 = 16"):
        plan.microbatches(bad)
    return worst


@pytest.mark.parametrize("world", sorted(CASES))
def test_context_parallel_equals_single_process(world: int):
    worst = run_distributed(_all_cases, world, timeout=600)
    print("max relative diff per case (rank 0):", [f"{w:.2e}" for w in worst[0]])
