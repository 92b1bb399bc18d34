"""Qwen2-VL's M-RoPE position ids: text tokens count 0, 1, 2, ... on all three axes; the rows of an image or
video take (temporal, height, width) positions on its merged patch grid, offset by the position where it starts,
and the text after it resumes past the larger of its merged height and width (transformers' `get_rope_index`).

Host-side and cheap: the data pipeline computes them with the batch, so that no step waits for the device.
"""

from __future__ import annotations

import torch


def grid_positions(start: int, grid: tuple[int, int, int], merge: int, interval: float) -> torch.Tensor:
    """`[t * (h / merge) * (w / merge), 3]` positions of one item's LM rows (frame, row, column order): the
    temporal axis at start + floor(frame * interval), the others at start + row, start + column."""
    t, h, w = grid
    frames = (torch.arange(t) * interval).long() + start
    rows, cols = torch.arange(h // merge) + start, torch.arange(w // merge) + start
    tt, hh, ww = torch.meshgrid(frames, rows, cols, indexing="ij")
    return torch.stack([tt, hh, ww], dim=-1).reshape(-1, 3)


def mrope_positions(input_ids: torch.Tensor, token_id: int, grid_thw: torch.Tensor, merge: int,
                    intervals: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, S, 3]` position ids of a batch whose images and videos, `grid_thw` `[n, 3]` (in patches), fill the
    placeholders `token_id` in batch-major order, each item taking t * h * w / merge^2 of them.

    `intervals` `[n]`: the temporal step per frame of each item (Qwen2.5-VL: tokens_per_second x seconds per
    temporal patch for a video; an image has one frame, so its step does not matter); default 1. Positions where
    `attention_mask` `[B, S]` is 0 are skipped (left at 0) and do not count, as in transformers. Items must fill
    the placeholders exactly (ValueError otherwise)."""
    if input_ids.dim() != 2 or grid_thw.dim() != 2 or grid_thw.shape[-1] != 3:
        raise ValueError(f"input_ids must be [B, S] and grid_thw [n, 3]; got {tuple(input_ids.shape)} and "
                         f"{tuple(grid_thw.shape)}")
    grids = [tuple(int(x) for x in g) for g in grid_thw.tolist()]
    steps = [1.0] * len(grids) if intervals is None else [float(x) for x in intervals.tolist()]
    out = torch.zeros(*input_ids.shape, 3, dtype=torch.long)
    item = 0
    for b, row in enumerate(input_ids.tolist()):
        keep = range(len(row)) if attention_mask is None else attention_mask[b].nonzero().reshape(-1).tolist()
        pos, left = 0, 0  # next text position; placeholders left in the current item
        item_rows: list[torch.Tensor] = []
        for s in keep:
            if row[s] != token_id:
                out[b, s] = pos
                pos += 1
                continue
            if not left:
                if item >= len(grids):
                    raise ValueError(f"input_ids hold more placeholders ({token_id}) than grid_thw's {len(grids)} "
                                     "items fill")
                t, h, w = grids[item]
                item_rows, left = list(grid_positions(pos, grids[item], merge, steps[item])), t * h * w // merge**2
                pos += max(h, w) // merge
                item += 1
            out[b, s] = item_rows[len(item_rows) - left]
            left -= 1
        if left:
            raise ValueError(f"row {b} ends {left} placeholders short of its last item's rows; each image's or video's "
                             "placeholders must lie in one row")
    if item != len(grids):
        raise ValueError(f"grid_thw has {len(grids)} items but the placeholders fill only {item}")
    return out
