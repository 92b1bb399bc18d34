"""A Qwen2-VL / Qwen2.5-VL vision tower: images and video frames at their own size, packed into one sequence.

Input: `pixel_values` `[N, C * T * P * P]`, the patches of every item of a batch one after the other (each item's
in Qwen's processor order: frame, merged row, merged column, then the merge x merge patches of that cell), and
`grid_thw` `[n, 3]` (frames / T, rows, columns of patches per item). A patch embeds as Qwen's Conv3d does (one
linear over its pixels); 2D rotary positions (row, column) turn each head's halves; attention is block-diagonal,
every frame of every item attending to itself (Qwen2.5-VL: within windows of `window` pixels, outside the
full-attention layers). Output `[N, hidden]` in input order; `PatchMerger` (the input projection) normalises and
merges each run of merge^2 rows into one LM row. Module names follow transformers' so weights map one to one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mimo.config.schema import NativeViTConfig
from mimo.models import init
from mimo.models.layers import MLP, RMSNorm, SwiGLU
from mimo.models.sample_rows import leading_row_index
from mimo.models.segment_attention import Segments, segment_attention, segments


def patch_coordinates(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """`[N, 4]` (item, frame, row, column) of every patch of `grid_thw`'s items, in processor order."""
    out = []
    for item, (t, h, w) in enumerate(grid_thw.tolist()):
        frame, brow, bcol, r, c = torch.meshgrid(torch.arange(t), torch.arange(h // merge), torch.arange(w // merge),
                                                 torch.arange(merge), torch.arange(merge), indexing="ij")
        rows, cols = brow * merge + r, bcol * merge + c
        out.append(torch.stack([torch.full_like(frame, item), frame, rows, cols], dim=-1).reshape(-1, 4))
    return torch.cat(out) if out else torch.zeros(0, 4, dtype=torch.long)


def block_segments(coords: torch.Tensor, window_patches: int) -> tuple[Segments, Segments | None]:
    """The attention segments of `coords`' patches: each frame of each item; and, with `window_patches` > 0,
    each `window_patches`-patch square window of a frame (Qwen2.5-VL's windows)."""
    if len(coords) == 0:
        return segments(coords[:, 0]), None
    item, frame, row, col = coords.unbind(-1)
    frame_id = item * (int(frame.max()) + 1) + frame
    if window_patches <= 0:
        return segments(frame_id), None
    win_r, win_c = row // window_patches, col // window_patches
    across, down = int(win_c.max()) + 1, int(win_r.max()) + 1
    return segments(frame_id), segments((frame_id * down + win_r) * across + win_c)


def vision_rope(coords: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin `[N, head_dim]` of Qwen2-VL's 2D RoPE: a quarter of the frequencies for the row, a quarter for the
    column, both halves alike (half-split layout)."""
    quarter = head_dim // 2
    inv = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float32) / quarter))
    freqs = torch.cat([coords[:, 2, None].float() * inv, coords[:, 3, None].float() * inv], dim=-1)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x` `[N, heads, D]` turned by `[N, D]` tables, in fp32 like transformers, back in x's dtype."""
    xf = x.float()
    half = x.shape[-1] // 2
    turned = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + turned * sin[:, None]).to(x.dtype)


class PackedAttention(nn.Module):
    """Multi-head attention over a packed `[N, hidden]` sequence: `qkv` (one biased linear), `proj`."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], segs: Segments) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, -1).unbind(1)
        q, k = rotate(q, *rope), rotate(k, *rope)
        return self.proj(segment_attention(q, k, v, segs).reshape(n, -1))


class NativeViTBlock(nn.Module):
    """Pre-norm block: Qwen2.5-VL's RMSNorm + biased SwiGLU, or Qwen2-VL's LayerNorm + fc1/fc2 MLP."""

    def __init__(self, cfg: NativeViTConfig):
        super().__init__()
        qwen25 = cfg.family == "qwen2_5_vl"
        self.norm1 = RMSNorm(cfg.hidden, 1e-6) if qwen25 else nn.LayerNorm(cfg.hidden, eps=1e-6)
        self.norm2 = RMSNorm(cfg.hidden, 1e-6) if qwen25 else nn.LayerNorm(cfg.hidden, eps=1e-6)
        self.attn = PackedAttention(cfg.hidden, cfg.heads)
        self.mlp = SwiGLU(cfg.hidden, cfg.mlp, cfg.act, bias=True) if qwen25 else MLP(cfg.hidden, cfg.mlp, cfg.hidden,
                                                                                        cfg.act)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], segs: Segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, segs)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    """Qwen's Conv3d patch embedding (kernel = stride = one patch, no bias) as one linear over a patch's pixels;
    `proj.weight` keeps the Conv3d shape `[hidden, C, T, P, P]`."""

    def __init__(self, cfg: NativeViTConfig):
        super().__init__()
        self.proj = nn.Conv3d(cfg.channels, cfg.hidden, (cfg.temporal_patch, cfg.patch, cfg.patch),
                              stride=(cfg.temporal_patch, cfg.patch, cfg.patch), bias=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        return F.linear(pixel_values.to(weight.dtype), weight.reshape(weight.shape[0], -1))


class NativeVisionTower(nn.Module):
    """`(pixel_values [N, C*T*P*P], grid_thw [n, 3])` -> `[N, hidden]` (see the module docstring)."""

    def __init__(self, cfg: NativeViTConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.blocks = nn.ModuleDict({str(i): NativeViTBlock(cfg) for i in range(cfg.layers)})
        self.init_weights()

    def init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv3d)):
                init.normal_(m.weight, std=self.cfg.init_std)
                if m.bias is not None:
                    init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, RMSNorm)):
                init.ones_(m.weight)
                if getattr(m, "bias", None) is not None:
                    init.zeros_(m.bias)

    def window_patches(self) -> int:
        """The side of a Qwen2.5-VL attention window in patches (0 = no windows)."""
        if self.cfg.family != "qwen2_5_vl" or not self.cfg.window:
            return 0
        return self.cfg.window // self.cfg.merge // self.cfg.patch * self.cfg.merge

    def rows_per_input(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """LM rows each item of the encoder inputs gives: t * h * w / merge^2 of its `grid_thw`."""
        return inputs["grid_thw"].prod(-1) // self.cfg.merge**2

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """`pixel_values` `[N, C*T*P*P]` packed, or `[n, most patches, C*T*P*P]` padded per item (the data
        pipeline's, so that batches split by items); `grid_thw` `[n, 3]`."""
        lay = tower_layout(self.cfg, self.window_patches(), pixel_values, grid_thw)
        if lay.stand_in:  # a batch without images: one merge cell of zeros
            pixel_values = pixel_values.new_zeros(self.cfg.merge**2, self.cfg.patch_pixels)
        elif lay.rows is not None:
            pixel_values = pixel_values.flatten(0, 1)[lay.rows]
        x = self.patch_embed(pixel_values)
        for key, block in self.blocks.items():
            full_layer = lay.windowed is None or int(key) in self.cfg.full_attention_layers
            x = block(x, lay.rope, lay.full if full_layer else lay.windowed)
        return x


@dataclass(frozen=True)
class TowerLayout:
    """What the tower's forward needs from `grid_thw`, on the input's device: `stand_in` (no patches: run a
    stand-in), `rows` (the patches of padded `pixel_values` `[n * K]` to keep; None for packed ones), the rotary
    tables, the segments of the full-attention and (None without windows) of the windowed layers."""

    stand_in: bool
    rows: torch.Tensor | None
    rope: tuple[torch.Tensor, torch.Tensor]
    full: Segments
    windowed: Segments | None


@torch._disable_dynamo  # torch.compiler.disable, Dynamo imported at the first call (segment_attention.py)
def tower_layout(cfg: NativeViTConfig, window_patches: int, pixel_values: torch.Tensor,
                 grid_thw: torch.Tensor) -> TowerLayout:
    """The `TowerLayout` of one forward, checked and built on the host (reading `grid_thw` there once, its one
    sync if it is on a GPU), outside torch.compile: `encoder_compile = "whole"` traces the rest unbroken by it."""
    if pixel_values.dim() not in (2, 3) or pixel_values.shape[-1] != cfg.patch_pixels:
        raise ValueError(f"pixel_values must be [patches, {cfg.patch_pixels}] (channels x temporal_patch x "
                         f"patch^2) or [items, patches, {cfg.patch_pixels}], got {tuple(pixel_values.shape)}")
    grid, device = grid_thw.cpu(), pixel_values.device
    coords = patch_coordinates(grid, cfg.merge)
    rows = None
    if pixel_values.dim() == 3:
        rows = leading_row_index(pixel_values.shape, grid.prod(-1), "pixel_values (padded per item)").to(device)
    patches = len(pixel_values) if rows is None else len(rows)
    stand_in = len(coords) == 0
    if stand_in:
        coords = torch.zeros(cfg.merge**2, 4, dtype=torch.long)
    elif len(coords) != patches:
        raise ValueError(f"grid_thw {grid.tolist()} gives {len(coords)} patches, pixel_values holds {patches}")
    full, windowed = block_segments(coords, window_patches)
    rope = tuple(t.to(device) for t in vision_rope(coords, cfg.hidden // cfg.heads, cfg.rope_theta))
    return TowerLayout(stand_in, rows, rope, full.to(device), None if windowed is None else windowed.to(device))


class PatchMerger(nn.Module):
    """`[N, hidden]` -> `[N / merge^2, out]`: `ln_q` (RMSNorm for Qwen2.5-VL, LayerNorm for Qwen2-VL), each run of
    merge^2 rows concatenated, then `mlp` (linear, GELU, linear)."""

    def __init__(self, cfg: NativeViTConfig, out: int, init_std: float):
        super().__init__()
        wide = cfg.hidden * cfg.merge**2
        self.ln_q = RMSNorm(cfg.hidden, 1e-6) if cfg.family == "qwen2_5_vl" else nn.LayerNorm(cfg.hidden, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(wide, wide), nn.GELU(), nn.Linear(wide, out))
        init.ones_(self.ln_q.weight)
        if getattr(self.ln_q, "bias", None) is not None:
            init.zeros_(self.ln_q.bias)
        for lin in (self.mlp[0], self.mlp[2]):
            init.normal_(lin.weight, std=init_std)
            init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).reshape(-1, self.mlp[0].in_features))
