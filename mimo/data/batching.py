"""Cutting a global batch into this rank's microbatches.

A batch is the keyword arguments of `MimoModel.forward` plus an optional `modality_counts`
(`{modality: LongTensor[B]}`, how many encoder inputs each sample holds; one each if absent), which
lets samples carry different numbers of images. Microbatch t is the contiguous run t of the global
batch; inside it the LM and each modality take the contiguous slice of their own DP lane, so text
and modality inputs may come from different (nested) sample ranges, as the colocated bridge expects.
"""

from __future__ import annotations

import torch

from mimo.config.schema import LANGUAGE
from mimo.models.loss import loss_weights
from mimo.models.multimodal import token_indices

COUNTS = "modality_counts"


def slice_batch(batch: dict, start: int, stop: int) -> dict:
    """Entries [start, stop) along dim 0 of every tensor in a (nested) dict."""
    out = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out[k] = slice_batch(v, start, stop)
        elif isinstance(v, torch.Tensor):
            out[k] = v[start:stop]
        else:
            out[k] = v
    return out


def leading_sizes(tree: dict, prefix: str = "") -> dict[str, int]:
    """Dim 0 of every tensor in a (nested) dict, by dotted key."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(leading_sizes(v, f"{prefix}{k}."))
        elif isinstance(v, torch.Tensor):
            out[prefix + k] = v.shape[0]
    return out


def to_device(tree: dict, device: torch.device) -> dict:
    """Every tensor of a nested dict on `device` (copies from pinned memory overlap with compute)."""
    return {k: to_device(v, device) if isinstance(v, dict) else
            v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in tree.items()}


def input_counts(batch: dict, name: str) -> torch.Tensor:
    """How many inputs of modality `name` each sample holds: `modality_counts[name]`, else one each when
    the batch has inputs of it and none when it has not."""
    counts = batch.get(COUNTS, {}).get(name)
    if counts is not None:
        return counts.long()
    has_inputs = name in batch.get("modality_inputs", {})
    return torch.full((batch["input_ids"].shape[0],), int(has_inputs), dtype=torch.long)


def rows_per_sample(counts: torch.Tensor, per_input: torch.Tensor) -> torch.Tensor:
    """Rows each sample's inputs become: `per_input` (one entry per input, samples' inputs in order)
    summed over each sample's `counts[s]` inputs. No host sync (the output size is known)."""
    sample = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts,
                                     output_size=per_input.numel())
    return torch.zeros_like(counts).index_add_(0, sample, per_input.to(counts.device))


def split_microbatches(batch: dict, microbatches: int, lanes: dict[str, tuple[int, int]] | None = None) -> list[dict]:
    """This rank's model inputs for each microbatch.

    `lanes` maps "language" and each modality to (this rank's DP index, DP size); absent = (0, 1).
    Inputs are sliced by the running sums of `modality_counts`, which `check_counts` (part of
    `mimo.data.checks.check_batch`) has checked against them.
    """
    lanes = lanes or {}
    n = batch["input_ids"].shape[0]
    if n % microbatches:
        raise ValueError(f"the global batch ({n}) must be divisible by parallel.microbatches ({microbatches})")
    counts = batch.get(COUNTS, {})
    text = {k: v for k, v in batch.items() if k not in ("modality_inputs", COUNTS)}
    per_mb = n // microbatches
    out = []
    for t in range(microbatches):
        j, lm_dp = lanes.get(LANGUAGE, (0, 1))
        lo, size = t * per_mb, per_mb // lm_dp
        local = slice_batch(text, lo + j * size, lo + (j + 1) * size)
        local["modality_inputs"] = {}
        for name, inputs in batch.get("modality_inputs", {}).items():
            i, dp = lanes.get(name, (0, 1))
            size = per_mb // dp
            a, b = lo + i * size, lo + (i + 1) * size
            if name in counts:
                ends = torch.cat([counts[name].new_zeros(1), counts[name].cumsum(0)])
                a, b = int(ends[a]), int(ends[b])
            local["modality_inputs"][name] = slice_batch(inputs, a, b)
        out.append(local)
    return out


def with_precomputed_rows(mb: dict, token_ids: dict[str, int]) -> dict:
    """A microbatch on the host with the flat positions its forward would otherwise find on the device (a
    host sync each): `modality_token_indices` of text and of each modality it has inputs of, and the positions
    that carry a label (`StepHints.loss_rows`)."""
    present = {n: t for n, t in token_ids.items() if n in mb.get("modality_inputs", {})}
    return with_loss_rows({**mb, "modality_token_indices": token_indices(mb["input_ids"], present)})


def with_loss_rows(mb: dict) -> dict:
    """A microbatch with `loss_rows`: the flat `B * S` positions that carry a label (`StepHints.loss_rows`),
    on the microbatch's device (a host sync there)."""
    return {**mb, "loss_rows": (loss_weights(mb["labels"], mb.get("loss_mask")).reshape(-1) > 0).nonzero().squeeze(1)}
