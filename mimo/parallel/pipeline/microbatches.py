"""What each pipeline stage reads from the global batch, microbatch by microbatch.

Only stages that need data read it (SPEC 3.2): an encoder's first stage (its inputs, and how many
inputs each sample holds), the LM's first stage (token and position ids) and the LM's last stage
(labels and loss mask). Slicing follows `mimo.data.batching`: microbatch t is the contiguous run t
of the global batch and each module takes its own DP lane's contiguous slice of it, so an encoder
lane holds P / enc_dp samples and an LM lane P / lm_dp samples of a microbatch of P.
"""

from __future__ import annotations

import torch

from mimo.config.schema import LANGUAGE
from mimo.data.batching import COUNTS, input_counts, split_microbatches

MODALITY_KEYS = ("modality_inputs", COUNTS)


def lm_microbatches(batch: dict, microbatches: int, lane: int, dp: int) -> list[dict]:
    """The LM lane's text tensors (ids, labels, positions, masks) of each microbatch."""
    text = {k: v for k, v in batch.items() if k not in MODALITY_KEYS}
    return split_microbatches(text, microbatches, {LANGUAGE: (lane, dp)})


def encoder_microbatches(batch: dict, name: str, encoder: str, microbatches: int, lane: int,
                         dp: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """Per microbatch: the encoder's keyword inputs for this lane and the number of inputs of each of
    the lane's samples (`input_counts`; checked against the inputs by `mimo.data.checks.check_batch`)."""
    inputs = batch.get("modality_inputs", {}).get(name)
    n = batch["input_ids"].shape[0]
    size = n // microbatches // dp
    local = split_microbatches(batch, microbatches, {name: (lane, dp)})
    counts = input_counts(batch, name)
    out = []
    for t, mb in enumerate(local):
        lo = t * (n // microbatches) + lane * size
        kwargs = mb["modality_inputs"].get(name, {}).get(encoder, {}) if inputs is not None else {}
        out.append((kwargs, counts[lo: lo + size]))
    return out

