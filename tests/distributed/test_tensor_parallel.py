"""Tensor (and sequence) parallelism reproduces single-process training.

Every rank builds the same seeded model, keeps a deep copy as the single-process reference and
parallelizes the other; both run the same batch. Losses, token counts, every gradient (the shard
against the matching slice of the reference) and the weights after one clipped AdamW step must agree
to float rounding, for the LM inside a MimoModel and for the ViT alone, with sequence parallel off
and on, at tp = world size and at tp = 1 (control). The collectives, the vocab-parallel cross
entropy and the configuration errors are checked on their own.

k_proj biases are frozen: softmax is invariant to a per-query constant, so their gradient is zero in
exact arithmetic and pure rounding noise in floats, which no relative tolerance can compare.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mimo.config.schema import ModalityConfig, ModelConfig, OptimConfig, ViTConfig
from mimo.models.build import build_model
from mimo.models.runtime import ModelRuntime
from mimo.models.step_hints import forward_args
from mimo.models.vit import VisionTransformer
from mimo.parallel import comm
from mimo.parallel.data import REPLICAS
from mimo.parallel.tensor import (
    mark_tp_replicated,
    parallelize_lm,
    parallelize_vit,
    sequence_shard,
    sync_sequence_parallel_grads,
    tp_lm_logits,
    tp_lm_loss,
)
from mimo.parallel.tensor_layers import vocab_parallel_cross_entropy
from mimo.train.optim import MimoOptimizer
from tests.support.configs import tiny_llm
from tests.support.dist import run_distributed

IMAGE_TOKEN = 60
LLM = tiny_llm(heads=8, kv_heads=4, mlp=32, init_std=0.2)
VIT = ViTConfig(image=24, patch=8, hidden=16, layers=2, heads=4, mlp=32, init_std=0.2)
VIT_TOKENS = (VIT.image // VIT.patch) ** 2 + 1
"""CLIP-style: 9 patches + class token = 10, so sequence parallel works at tp=2 and is refused at tp=4."""
SIGLIP = replace(VIT, image=16, patch=4, class_token=False, pre_norm=False, patch_bias=True, post_norm=True)
"""SigLIP-style: 16 patches, no class token, a final LayerNorm after the sequence is gathered."""
LM_CASES = [  # (sequence_parallel, tie_embeddings, qk_norm)
    (False, False, True),
    (True, False, False),
    (True, True, True),
]
RTOL = 1e-5


def _assert_close(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = float((got.detach() - want.detach()).abs().max())
    scale = float(want.detach().abs().max())
    assert diff <= RTOL * scale, f"{what}: max |diff| {diff:.3g} > {RTOL} x max |ref| {scale:.3g}"


def _slice_of(ref: torch.Tensor, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The part of a full reference tensor that this rank's shard holds (the whole of a replicated one)."""
    if ref.shape == local.shape:
        return ref
    dim = next(d for d in range(ref.dim()) if ref.shape[d] != local.shape[d])
    return ref.chunk(dist.get_world_size(group), dim)[dist.get_rank(group)]


def _prepare(model: nn.Module) -> None:
    """Random biases (the models init them to zero, so after one step they would hold nothing but the
    update, whose Adam normalisation amplifies rounding); frozen k_proj biases (see module docstring)."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.normal_(p, std=0.2)
    for m in model.modules():
        if hasattr(m, "k_proj") and m.k_proj.bias is not None:
            m.k_proj.bias.requires_grad_(False)


def _tp_norm_reducer(group: dist.ProcessGroup):
    def reduce(parts: dict[str, torch.Tensor]) -> torch.Tensor:
        total = torch.zeros(())
        for share in parts.values():
            share = share.clone()
            dist.all_reduce(share, group=group)
            total = total + share
        return total

    return reduce


def _compare_params(what: str, ref: nn.Module, par: nn.Module, group: dist.ProcessGroup, grads: bool) -> None:
    tp = dist.get_world_size(group)
    ref_params = dict(ref.named_parameters())
    par_params = dict(par.named_parameters())
    assert ref_params.keys() == par_params.keys(), f"{what}: parameter names changed"
    for name, p in par_params.items():
        r = ref_params[name]
        if grads:
            sharded = p.shape != r.shape
            assert getattr(p, REPLICAS) == (1 if sharded else tp), f"{what} {name}: REPLICAS"
            assert (p.grad is None) == (r.grad is None), f"{what} {name}: gradient presence differs"
            if p.grad is not None:
                _assert_close(f"{what} grad {name}", p.grad, _slice_of(r.grad, p, group))
        else:
            _assert_close(f"{what} weight {name}", p, _slice_of(r, p, group))


def _step_and_compare(what: str, ref: dict[str, nn.Module], par: dict[str, nn.Module],
                      group: dist.ProcessGroup) -> None:
    """One AdamW step clipped at half the true norm; Adam's eps is near the gradient scale so that
    the clipping factor visibly changes the update."""
    grads = [p.grad for m in ref.values() for p in m.parameters() if p.grad is not None]
    norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
    cfg = OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant", weight_decay=0.1, eps=1e-3, clip=norm / 2)
    ref_ok, ref_norm, _ = MimoOptimizer(ref, cfg, total_steps=1).step(0)
    par_ok, par_norm, _ = MimoOptimizer(par, cfg, total_steps=1, norm_sq_reduce=_tp_norm_reducer(group)).step(0)
    assert ref_ok and par_ok
    assert abs(par_norm - ref_norm) <= RTOL * ref_norm, f"{what}: grad norm {par_norm} != {ref_norm}"
    for name in ref:
        _compare_params(f"{what} {name}", ref[name], par[name], group, grads=False)


def _lm_batch() -> dict:
    """Two samples with four image tokens each and different numbers of loss tokens (6 and 3)."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 50, (2, 12), generator=g)
    ids[:, 1:5] = IMAGE_TOKEN
    labels = torch.full_like(ids, -100)
    labels[0, 5:11] = ids[0, 6:12]
    labels[1, 8:11] = ids[1, 9:12]
    loss_mask = torch.ones(2, 12)
    loss_mask[0, 6] = 0.0
    pixels = torch.randn(2, 3, 16, 16, generator=g)
    return {"input_ids": ids, "labels": labels, "loss_mask": loss_mask,
            "modality_inputs": {"images": {"vit": {"pixel_values": pixels}}}}


def _check_lm(group: dist.ProcessGroup, sequence_parallel: bool, tied: bool, qk_norm: bool) -> None:
    what = f"lm tp={dist.get_world_size(group)} sp={sequence_parallel} tied={tied} qk_norm={qk_norm}"
    cfg = ModelConfig(llm=replace(LLM, tie_embeddings=tied, qk_norm=qk_norm),
                      modalities={"images": ModalityConfig(token_id=IMAGE_TOKEN,
                                                           vit=ViTConfig(image=16, patch=8, hidden=16, heads=2,
                                                                         mlp=32, init_std=0.2))})
    torch.manual_seed(0)
    ref = build_model(cfg)
    _prepare(ref)
    par = copy.deepcopy(ref)
    parallelize_lm(par.language_model, group, sequence_parallel)
    mark_tp_replicated(par.modality_submodules, dist.get_world_size(group))  # replicated on every TP rank
    par.set_runtime(ModelRuntime(loss_fn=tp_lm_loss(group, sequence_parallel),
                                 logits_fn=tp_lm_logits(group, sequence_parallel),
                                 shard_sequence=sequence_shard(group) if sequence_parallel else None))

    batch = _lm_batch()
    want, got = ref(**forward_args(batch)), par(**forward_args(batch))
    assert float(got.num_tokens) == float(want.num_tokens) == 8.0
    _assert_close(f"{what} loss sum", got.loss_sum, want.loss_sum)
    (want.loss_sum / want.num_tokens).backward()
    (got.loss_sum / got.num_tokens).backward()
    sync_sequence_parallel_grads(par.language_model, group)
    _compare_params(what, ref, par, group, grads=True)

    modules = lambda m: {"language": m.language_model, "images": m.modality_submodules["images"]}  # noqa: E731
    _step_and_compare(what, modules(ref), modules(par), group)
    with torch.no_grad():
        inference = {k: v for k, v in batch.items() if k not in ("labels", "loss_mask")}
        _assert_close(f"{what} logits", par(**forward_args(inference)).logits, ref(**forward_args(inference)).logits)


def _check_vit(group: dist.ProcessGroup, cfg: ViTConfig, sequence_parallel: bool) -> None:
    what = f"vit tp={dist.get_world_size(group)} sp={sequence_parallel} class_token={cfg.class_token}"
    torch.manual_seed(1)
    ref = VisionTransformer(cfg)
    _prepare(ref)
    par = copy.deepcopy(ref)
    parallelize_vit(par, group, sequence_parallel)
    g = torch.Generator().manual_seed(6)
    pixels = torch.randn(2, 3, cfg.image, cfg.image, generator=g)
    target = torch.randn(2, ref.tokens_per_image, cfg.hidden, generator=g)
    want, got = ref(pixels), par(pixels)
    _assert_close(f"{what} output", got, want)
    (want * target).sum().backward()
    (got * target).sum().backward()
    sync_sequence_parallel_grads(par, group)
    _compare_params(what, ref, par, group, grads=True)
    _step_and_compare(what, {"vit": ref}, {"vit": par}, group)


def _model_cases(rank: int, world: int) -> None:
    solo = dist.new_subgroups_by_enumeration([[r] for r in range(world)])[0]
    for group in (dist.group.WORLD, solo):
        for sp, tied, qk_norm in LM_CASES:
            _check_lm(group, sp, tied, qk_norm)
        for sp in (False, True):
            if not sp or VIT_TOKENS % dist.get_world_size(group) == 0:
                _check_vit(group, VIT, sp)
            _check_vit(group, SIGLIP, sp)


def _check_collectives(group: dist.ProcessGroup) -> None:
    """Each pair's forward and adjoint backward on a non-leading dim, rank-dependent inputs."""
    tp, r = dist.get_world_size(group), dist.get_rank(group)
    g = torch.Generator().manual_seed(2)
    full, grad = torch.randn(2, 4 * tp, 3, generator=g), torch.randn(2, 4 * tp, 3, generator=g)
    chunk = lambda t: t.chunk(tp, 1)[r]  # noqa: E731
    total = tp * (tp + 1) / 2  # sum over ranks of (rank + 1)
    cases = [  # (name, fn, input, grad fed back, expected output, expected input grad)
        ("copy_to_tp", comm.copy_to_tp, full, grad * (r + 1), full, grad * total),
        ("reduce_from_tp", comm.reduce_from_tp, full * (r + 1), grad, full * total, grad),
        ("split_to_tp", lambda x, gr: comm.split_to_tp(x, gr, 1), full, chunk(grad), chunk(full), grad),
        ("gather_from_tp", lambda x, gr: comm.gather_from_tp(x, gr, 1), chunk(full), grad, full, chunk(grad)),
        ("gather_from_sp", lambda x, gr: comm.gather_from_sp(x, gr, 1), chunk(full), grad * (r + 1), full,
         chunk(grad * total)),
        ("reduce_scatter_to_sp", lambda x, gr: comm.reduce_scatter_to_sp(x, gr, 1), full * (r + 1), chunk(grad),
         chunk(full * total), grad),
    ]
    for name, fn, x, gout, want_out, want_grad in cases:
        x = x.clone().requires_grad_()
        out = fn(x, group)
        out.backward(gout)
        _assert_close(f"{name} forward", out, want_out)
        _assert_close(f"{name} backward", x.grad, want_grad)


def _check_vocab_cross_entropy(group: dist.ProcessGroup) -> None:
    tp, r = dist.get_world_size(group), dist.get_rank(group)
    g = torch.Generator().manual_seed(3)
    vocab = 8 * tp
    logits = 3 * torch.randn(5, 3, vocab, generator=g)
    labels = torch.randint(0, vocab, (5, 3), generator=g)
    labels[0, 1] = -100
    labels[2] = -100
    weights = torch.rand(5, 3, generator=g)
    full = logits.clone().requires_grad_()
    want = F.cross_entropy(full.reshape(-1, vocab), labels.reshape(-1), reduction="none").view(5, 3)
    (want * weights).sum().backward()
    shard = logits.chunk(tp, -1)[r].clone().requires_grad_()
    got = vocab_parallel_cross_entropy(shard, labels, group)
    (got * weights).sum().backward()
    _assert_close("vocab-parallel CE", got, want)
    assert float(got[0, 1]) == 0.0 and bool((got[2] == 0).all())
    _assert_close("vocab-parallel CE grad", shard.grad, full.grad.chunk(tp, -1)[r])
    with pytest.raises(ValueError, match="must agree on every dim"):
        vocab_parallel_cross_entropy(shard, labels[:, :2], group)


def _check_errors(group: dist.ProcessGroup) -> None:
    """A sequence that sequence parallel cannot split is refused per batch (the sizes of the model, which
    parallelize_lm and parallelize_vit assert, are the gate's: tests/unit/test_gate.py)."""
    tp = dist.get_world_size(group)
    with pytest.raises(ValueError, match=rf"sequence length S={tp + 1} must be divisible by tp={tp} for sequence "
                                         "parallel; pad"):
        sequence_shard(group)(torch.zeros(1, tp + 1, 4))


def _unit_cases(rank: int, world: int) -> None:
    _check_collectives(dist.group.WORLD)
    _check_vocab_cross_entropy(dist.group.WORLD)
    _check_errors(dist.group.WORLD)


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_cross_entropy_and_errors(world: int) -> None:
    run_distributed(_unit_cases, world, timeout=60)


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_matches_single_process(world: int) -> None:
    run_distributed(_model_cases, world, timeout=90)
