"""Segment attention (no `[N, N]` mask) gives what SDPA over the whole packed sequence with a dense same-segment
mask gives: on random segment ids, and through the native tower on images of mixed sizes and a video, whose
windowed and full-attention layers both run (the oracle is the tower's former dense-mask forward). The CUDA path's
wiring (`varlen_segment_attention`: the segments one after another, `cu_seqlens`) gives it too, through a CPU kernel
that keeps `varlen_attn`'s contract (tests/gpu/test_native_attention_gpu.py runs the real kernel)."""

import pytest
import torch
import torch.nn.functional as F

from mimo.models.native_vit import NativeVisionTower, block_segments, patch_coordinates, rotate, vision_rope
from mimo.models.segment_attention import segment_attention, segments, varlen_segment_attention
from tests.support.configs import tiny_native

pytestmark = pytest.mark.usefixtures("one_thread")


def dense_attention(q, k, v, ids):
    """The oracle: `[N, heads, D]` SDPA over the whole sequence, a patch attending where `ids` are equal."""
    mask = (ids[:, None] == ids[None, :])[None, None]
    out = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), attn_mask=mask)
    return out[0].transpose(0, 1)


def test_segments_of_scattered_ids_match_a_dense_mask():
    torch.manual_seed(0)
    ids = torch.randint(0, 9, (157,)) * 7  # nine segments of random, mostly distinct lengths, interleaved
    q, k, v = torch.randn(3, 157, 2, 8).unbind(0)
    segs = segments(ids)
    assert sum(g * n for g, n in segs.groups) == 157 and sorted(segs.perm.tolist()) == list(range(157))
    torch.testing.assert_close(segment_attention(q, k, v, segs), dense_attention(q, k, v, ids), rtol=0, atol=1e-6)


def dense_tower(tower: NativeVisionTower, pixels: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
    """The tower's forward as it was with dense `[N, N]` masks: same frame, and same window outside the
    full-attention layers."""
    cfg, wp = tower.cfg, tower.window_patches()
    coords = patch_coordinates(grids, cfg.merge)
    frame = coords[:, 0] * (int(coords[:, 1].max()) + 1) + coords[:, 1]
    window = (frame * 1000 + coords[:, 2] // wp) * 1000 + coords[:, 3] // wp
    rope = vision_rope(coords, cfg.hidden // cfg.heads, cfg.rope_theta)
    x = tower.patch_embed(pixels)
    for key, block in tower.blocks.items():
        attn, n = block.attn, x.shape[0]
        q, k, v = attn.qkv(block.norm1(x)).view(n, 3, attn.heads, -1).unbind(1)
        ids = frame if int(key) in cfg.full_attention_layers else window
        out = dense_attention(rotate(q, *rope), rotate(k, *rope), v, ids)
        x = x + attn.proj(out.reshape(n, -1))
        x = x + block.mlp(block.norm2(x))
    return x


def test_tower_matches_its_dense_mask_forward_on_mixed_images_and_a_video():
    torch.manual_seed(0)
    tower = NativeVisionTower(tiny_native(layers=3, full_attention_layers=[1])).eval()
    # 4 x 4-patch windows: the 10 x 14 image has ragged windows at its right and bottom, the video has 3 frames
    grids = torch.tensor([[1, 10, 14], [3, 6, 4], [1, 4, 4], [1, 2, 6]])
    pixels = torch.randn(int(grids.prod(-1).sum()), tower.cfg.patch_pixels)
    full, windowed = block_segments(patch_coordinates(grids, 2), tower.window_patches())
    assert full.groups == ((1, 12), (1, 16), (3, 24), (1, 140))  # one segment per frame
    assert {n for _, n in windowed.groups} == {4, 8, 16}  # 4 x 4 windows, ragged 2 x 4, 4 x 2, 2 x 2 ones
    with torch.no_grad():
        got, want = tower(pixels, grids), dense_tower(tower, pixels, grids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def varlen_on_cpu(q, k, v, cu_q, cu_k, max_q, max_k):
    """`varlen_attn`'s contract on the CPU: `[T, heads, D]` q, k, v; each run [cu[i], cu[i + 1]) attends to itself."""
    assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and max_q == max_k and int(cu_q[-1]) == len(q)
    out = torch.empty_like(q)
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
        assert 0 < b - a <= max_q
        out[a:b] = F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v))).transpose(0, 1)
    return out


def test_varlen_wiring_matches_a_dense_mask_on_frames_and_windows():
    torch.manual_seed(0)
    ids = torch.randint(0, 9, (157,)) * 7
    q, k, v = torch.randn(3, 157, 2, 8).unbind(0)
    segs = segments(ids)
    assert segs.longest == max(n for _, n in segs.groups)
    torch.testing.assert_close(varlen_segment_attention(q, k, v, segs, varlen_on_cpu), dense_attention(q, k, v, ids),
                               rtol=0, atol=1e-6)
    grids = torch.tensor([[1, 10, 14], [3, 6, 4], [1, 4, 4]])
    coords = patch_coordinates(grids, 2)
    q, k, v = torch.randn(3, len(coords), 2, 8).unbind(0)
    for segs in block_segments(coords, 4):
        torch.testing.assert_close(varlen_segment_attention(q, k, v, segs, varlen_on_cpu),
                                   segment_attention(q, k, v, segs), rtol=0, atol=1e-6)
