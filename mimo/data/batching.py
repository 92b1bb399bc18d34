"""Cutting a global batch into this rank's microbatches.

A batch is the keyword arguments of `MimoModel.forward` plus an optional `modality_counts`
(`{modality: LongTensor[B]}`, how many encoder inputs each sample holds; one each if absent), which
lets samples carry different numbers of images. Microbatch t is the contiguous run t of the global
batch; inside it the LM and each modality take the contiguous slice of their own DP lane, so text
and modality inputs may come from different (nested) sample ranges, as the colocated bridge expects.
"""

from __future__ import annotations

import torch

COUNTS = "modality_counts"
LANGUAGE = "language"


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


def split_microbatches(batch: dict, microbatches: int, lanes: dict[str, tuple[int, int]] | None = None) -> list[dict]:
    """This rank's model inputs for each microbatch.

    `lanes` maps "language" and each modality to (this rank's DP index, DP size); absent = (0, 1).
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
