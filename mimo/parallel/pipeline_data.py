"""What each pipeline stage reads from the global batch, microbatch by microbatch.

Only stages that need data read it (SPEC 3.2): an encoder's first stage (its inputs, and how many
inputs each sample holds), the LM's first stage (token and position ids) and the LM's last stage
(labels and loss mask). Slicing follows `mimo.data.batching`: microbatch t is the contiguous run t
of the global batch and each module takes its own DP lane's contiguous slice of it, so an encoder
lane holds P / enc_dp samples and an LM lane P / lm_dp samples of a microbatch of P.
"""

from __future__ import annotations

import torch

from mimo.data.batching import COUNTS, LANGUAGE, split_microbatches

MODALITY_KEYS = ("modality_inputs", COUNTS)


def to_device(tree: dict, device: torch.device) -> dict:
    """Every tensor of a nested dict on `device`."""
    return {k: to_device(v, device) if isinstance(v, dict) else v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in tree.items()}


def lm_microbatches(batch: dict, microbatches: int, lane: int, dp: int) -> list[dict]:
    """The LM lane's text tensors (ids, labels, positions, masks) of each microbatch."""
    text = {k: v for k, v in batch.items() if k not in MODALITY_KEYS}
    return split_microbatches(text, microbatches, {LANGUAGE: (lane, dp)})


def encoder_microbatches(batch: dict, name: str, encoder: str, microbatches: int, lane: int,
                         dp: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """Per microbatch: the encoder's keyword inputs for this lane and the number of inputs of each of
    the lane's samples (`modality_counts`, else one each; none when the batch lacks the modality)."""
    inputs = batch.get("modality_inputs", {}).get(name)
    n = batch["input_ids"].shape[0]
    size = n // microbatches // dp
    local = split_microbatches(batch, microbatches, {name: (lane, dp)})
    counts = batch.get(COUNTS, {}).get(name)
    if counts is None or inputs is None:
        counts = torch.full((n,), int(inputs is not None), dtype=torch.long)
    out = []
    for t, mb in enumerate(local):
        lo = t * (n // microbatches) + lane * size
        per_sample = counts[lo: lo + size].long()
        kwargs = mb["modality_inputs"].get(name, {}).get(encoder, {}) if inputs is not None else {}
        sizes = {v.shape[0] for v in kwargs.values() if isinstance(v, torch.Tensor)}
        if sizes - {int(per_sample.sum())}:
            raise ValueError(f"modality '{name}': microbatch {t}, lane {lane} holds inputs of {sorted(sizes)} items "
                             f"but its samples count {int(per_sample.sum())}; make modality_counts['{name}'] match "
                             f"the inputs of encoder '{encoder}'")
        out.append((kwargs, per_sample))
    return out

