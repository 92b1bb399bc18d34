"""Packed rows for attention tests: per-position document ids from each row's document lengths; and the padded
image-text samples the packing parity suites pack."""

import torch

from tests.support.configs import image_text_batch


def document_ids(lengths: list[list[int]]) -> torch.Tensor:
    """`[B, S]` long: each position's document index within its row (rows of equal total length)."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths])


def padded_samples(images_per_sample: list[int], seq: int, token_id: int, pad: int) -> dict:
    """An `image_text_batch` (seed 7) whose sample s ends after 3 + 4 x images + (5s mod 6) tokens: its images'
    placeholders after the first token, then text, then `pad` (labels -100 from its last token on)."""
    batch = image_text_batch(torch.tensor(images_per_sample), seq, token_id, torch.Generator().manual_seed(7))
    for s, k in enumerate(images_per_sample):
        length = 3 + 4 * k + (5 * s) % 6
        batch["input_ids"][s, length:] = pad
        batch["labels"][s, length - 1:] = -100
    return batch
