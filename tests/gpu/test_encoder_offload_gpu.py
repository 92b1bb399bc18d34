"""`perf.encoder_offload`'s move on CUDA (mimo.parallel.pipeline.offload.HostOffload, as the colocated pipelined
plan calls it between its encoder forwards and backwards): a ViT's weights and fused AdamW moments leave the GPU
(memory allocated drops by their bytes, into pinned buffers) while its forward's graph waits, the freed blocks
are overwritten, and after `back` the backward and 3 steps of AdamW give bitwise the losses, gradients and
weights of the run that kept them. One process; the trainer's own run of the key needs a colocated pipelined
layout, which the gloo tests cover on CPU (tests/distributed/test_encoder_offload.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from mimo.config.model_config import ViTConfig
from mimo.models.vit import VisionTransformer
from mimo.parallel.pipeline.offload import HostOffload
from mimo.train.optim import torch_state_tensors

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

VIT = ViTConfig(image=64, patch=8, hidden=256, layers=4, heads=4, mlp=1024)
BLOCK = 512  # the caching allocator's rounding: every tensor here is a multiple of it


@contextlib.contextmanager
def _deterministic():
    """cuDNN's deterministic kernels and the math attention, so two runs of the same steps agree bitwise."""
    before = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.cudnn.deterministic = before


def _steps(offload: bool) -> tuple[list[torch.Tensor], list[dict], dict, list[tuple[int, int]]]:
    """3 steps of the ViT: each step's loss, gradients, the weights after them, and per step (memory allocated
    freed by `out`, the bytes of weights and moments moved)."""
    torch.manual_seed(0)
    vit = VisionTransformer(VIT).cuda()
    for p in vit.parameters():
        torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(vit.parameters(), lr=1e-3, fused=True)
    host, losses, grads, moved = HostOffload(), [], [], []
    for step in range(3):
        x = torch.randn(8, 3, VIT.image, VIT.image, device="cuda", generator=torch.Generator("cuda").manual_seed(step))
        loss = vit(x).float().pow(2).mean()  # the graph refers to the weights and holds the activations
        if offload:
            held = list(vit.parameters()) + torch_state_tensors(opt)
            nbytes = sum(t.untyped_storage().nbytes() for t in held)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            host.out(held, keep=[])
            moved.append((before - torch.cuda.memory_allocated(), nbytes))
            assert all(b.is_pinned() for b in host.buffers)
            scratch = [torch.full_like(t, float("nan")) for t in held]  # reuses the freed blocks after the copies
            del scratch
            host.back()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in vit.named_parameters()})
        losses.append(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads, {n: p.detach().clone() for n, p in vit.named_parameters()}, moved


def test_offloaded_encoder_frees_its_bytes_and_trains_bitwise_alike():
    with _deterministic():
        kept = _steps(offload=False)
        losses, grads, weights, moved = _steps(offload=True)
    params = sum(p.numel() * 4 for p in kept[2].values())
    assert moved[0][1] == params, "before the first update only the weights move"
    assert moved[1][1] == moved[2][1] == 3 * params, "then the weights and both moments"
    for step, (freed, nbytes) in enumerate(moved):
        assert nbytes <= freed <= nbytes + BLOCK * len(kept[2]) * 3, f"step {step}: freed {freed} of {nbytes} bytes"
    assert all(torch.equal(a, b) for a, b in zip(losses, kept[0], strict=True)), (losses, kept[0])
    for step, (got, ref) in enumerate(zip(grads, kept[1], strict=True)):
        for name in ref:
            assert torch.equal(got[name], ref[name]), f"step {step}: gradient of {name}"
    for name in kept[2]:
        assert torch.equal(weights[name], kept[2][name]), f"weight {name}"
