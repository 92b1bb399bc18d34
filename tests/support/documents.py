"""Packed rows for attention tests: per-position document ids from each row's document lengths."""

import torch


def document_ids(lengths: list[list[int]]) -> torch.Tensor:
    """`[B, S]` long: each position's document index within its row (rows of equal total length)."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths])
