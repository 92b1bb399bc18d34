"""The native tower's attention on CUDA (one `varlen_attn` over every frame or window, no `[N, N]` mask) against the
CPU reference path (one SDPA per group of equal-length segments, fp32), forward and backward, within bf16
tolerance, on Qwen2.5-VL's shapes (16 heads of 80): images of two sizes with ragged windows and a video, frames
(full-attention layers) and windows; eager and inside a compiled function as a compiled block calls it. A bf16
tower forward and backward on CUDA takes that path in every block."""

import pytest
import torch

from mimo.models import segment_attention as seg
from mimo.models.native_vit import NativeVisionTower, block_segments, patch_coordinates
from tests.support.configs import tiny_native

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(seg.varlen_kernel() is None, reason="this PyTorch has no varlen_attn")]

GRIDS = torch.tensor([[1, 36, 52], [1, 20, 12], [4, 16, 24]])  # two image sizes, a video of 8 frames (t = 4)
WINDOW = 8  # patches: Qwen2.5-VL's 112-pixel windows of 14-pixel patches


def _run(fn, q, k, v, grad, segs):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, segs)
    out.backward(grad)
    return out.detach().float().cpu(), [t.grad.float().cpu() for t in (q, k, v)]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("layer", ["frames", "windows"])
def test_varlen_path_equals_the_grouped_cpu_reference(layer, compiled):
    full, windowed = block_segments(patch_coordinates(GRIDS, 2), WINDOW)
    segs = full if layer == "frames" else windowed
    n = int(GRIDS.prod(-1).sum())
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(n, 16, 80, generator=g) for _ in range(4))
    ref_out, ref_grads = _run(seg.segment_attention, q, k, v, grad, segs)
    fn = torch.compile(seg.segment_attention) if compiled else seg.segment_attention
    out, grads = _run(fn, *(t.cuda().bfloat16() for t in (q, k, v, grad)), segs.to(torch.device("cuda")))
    assert (out - ref_out).abs().max() / ref_out.abs().max() < 1e-2
    for got, want in zip(grads, ref_grads):
        assert (got - want).abs().max() / want.abs().max() < 1e-2


def test_bf16_tower_attends_through_varlen_in_every_block(monkeypatch):
    calls = []
    real = seg.varlen_segment_attention
    monkeypatch.setattr(seg, "varlen_segment_attention", lambda *a: calls.append(1) or real(*a))
    tower = NativeVisionTower(tiny_native(layers=3, hidden=64, mlp=64)).cuda().bfloat16()
    grids = torch.tensor([[1, 10, 14], [3, 6, 4]])
    pixels = torch.randn(int(grids.prod(-1).sum()), tower.cfg.patch_pixels, device="cuda", dtype=torch.bfloat16)
    tower(pixels, grids).float().square().mean().backward()
    assert len(calls) == 3 and all(p.grad is not None for p in tower.parameters())
