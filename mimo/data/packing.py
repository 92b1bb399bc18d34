"""Sequence packing: several samples per row, each attending only to itself.

A padded batch spends most of its tokens on padding when samples are much shorter than the row.
Packing moves each sample's real tokens (its prefix up to the last non-pad token or label) into rows
of `pack_length` tokens by greedy first fit, in batch order. Inside a row every sample is one
*document*: it keeps its unpacked positions, which restart at 0 (RoPE sees the same positions as unpacked;
M-RoPE's `[B, S, 3]` ones keep their three axes, its images' and videos' grid positions included), and a
block-diagonal causal attention mask keeps documents apart, so each sample's hidden states, loss and loss-token count
equal those of the unpacked batch. The batch carries only each token's `document_ids` `[R, L]`; the
model builds the `[R, 1, L, L]` mask from them where its tensors live (on a GPU, not on the host, and
never copied: at L = 4096 a row's mask is 16 MiB). Labels are shifted inside each sample by the
data set, so no label ever points into the next document. The padding at a row's end is one more
document of its own (every query sees at least itself, so SDPA never meets an all-masked row).

Modality inputs follow their samples: each modality's inputs are reordered into the packed sample
order and `modality_counts` gives the number per packed row, so DP lanes and bridges slice them by
rows as usual. Rows are padded with empty rows up to a multiple of `row_multiple` (microbatches x DP
degrees) so the batch splits evenly; those rows count as padding.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mimo.data.batching import COUNTS, input_counts
from mimo.data.chat import special_ids
from mimo.models.loss import IGNORE_INDEX

PACKABLE = frozenset({"input_ids", "labels", "loss_mask", "position_ids", "modality_inputs", COUNTS})


def sample_lengths(input_ids: torch.Tensor, labels: torch.Tensor | None, pad_id: int) -> torch.Tensor:
    """Tokens each sample really uses: up to its last non-pad input or last label, whichever is later."""
    used = input_ids != pad_id
    if labels is not None:
        used = used | (labels != IGNORE_INDEX)
    positions = torch.arange(1, input_ids.shape[1] + 1)
    return (used * positions).max(dim=1).values


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Greedy first fit in the given order: each sample goes into the first row that still has room."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i, n in enumerate(lengths):
        if n > capacity:
            raise ValueError(f"a sample of {n} tokens does not fit data.pack_length = {capacity}; raise "
                             f"data.pack_length to at least {n}")
        slot = next((r for r, room in enumerate(free) if room >= n), None)
        if slot is None:
            rows.append([])
            free.append(capacity)
            slot = len(rows) - 1
        rows[slot].append(i)
        free[slot] -= n
    return rows


@dataclass
class PackStats:
    """Token counts of packed batches: real tokens, and the row tokens spent before and after packing."""

    real: int = 0
    unpacked: int = 0
    packed: int = 0

    def add(self, other: PackStats) -> None:
        self.real += other.real
        self.unpacked += other.unpacked
        self.packed += other.packed

    def report(self) -> dict[str, float]:
        return {"padding_before": round(1 - self.real / max(self.unpacked, 1), 4),
                "padding_after": round(1 - self.real / max(self.packed, 1), 4),
                "tokens_before": self.unpacked, "tokens_after": self.packed, "real_tokens": self.real}


def _reorder_inputs(inputs: Any, index: torch.Tensor) -> Any:
    if isinstance(inputs, dict):
        return {k: _reorder_inputs(v, index) for k, v in inputs.items()}
    return inputs.index_select(0, index.to(inputs.device))


def _ramp(n: int, axes: tuple[int, ...]) -> torch.Tensor:
    """Positions 0..n-1, the same on every axis: `[n, *axes]`."""
    return torch.arange(n).reshape(n, *[1] * len(axes)).expand(n, *axes)


def pack_batch(batch: dict, pad_id: int, pack_length: int, row_multiple: int = 1) -> tuple[dict, PackStats]:
    """A padded batch (MimoModel.forward keyword arguments plus `modality_counts`) -> a packed batch.

    The packed batch holds `input_ids`, `labels`, `position_ids`, `document_ids`, `loss_mask` if the
    input had one, `modality_inputs` and `modality_counts` (per packed row). Pure, deterministic.
    """
    unknown = sorted(set(batch) - PACKABLE)
    if unknown:
        raise ValueError(f"cannot pack batch entries {unknown}; packing handles {sorted(PACKABLE)}")
    if row_multiple < 1:
        raise ValueError(f"row_multiple must be >= 1, got {row_multiple}")
    ids, labels = batch["input_ids"], batch.get("labels")
    n, seq = ids.shape
    lengths = sample_lengths(ids, labels, pad_id).tolist()
    rows = first_fit(lengths, pack_length)
    rows += [[] for _ in range(-len(rows) % row_multiple)]
    shape = (len(rows), pack_length)
    positions = batch.get("position_ids")
    axes = () if positions is None else tuple(positions.shape[2:])  # M-RoPE's `[B, S, 3]`: three axes
    out = {"input_ids": torch.full(shape, pad_id, dtype=ids.dtype),
           "labels": torch.full(shape, IGNORE_INDEX, dtype=torch.long),
           "position_ids": torch.zeros(*shape, *axes, dtype=torch.long)}
    docs = torch.zeros(shape, dtype=torch.long)
    per_token = {"input_ids": ids, "position_ids": positions}
    if labels is not None:
        per_token["labels"] = labels
    if batch.get("loss_mask") is not None:
        out["loss_mask"] = torch.zeros(shape, dtype=batch["loss_mask"].dtype)
        per_token["loss_mask"] = batch["loss_mask"]
    for r, members in enumerate(rows):
        at = 0
        for d, i in enumerate(members):
            k = lengths[i]
            for key, src in per_token.items():
                out[key][r, at:at + k] = src[i, :k] if src is not None else _ramp(k, axes)
            docs[r, at:at + k] = d
            at += k
        docs[r, at:] = len(members)
        out["position_ids"][r, at:] = _ramp(pack_length - at, axes)
    out["document_ids"] = docs
    order = [i for members in rows for i in members]
    out["modality_inputs"], out[COUNTS] = {}, {}
    for name, inputs in batch.get("modality_inputs", {}).items():
        counts = input_counts(batch, name).tolist()
        starts = [0, *itertools.accumulate(counts)]
        index = [j for i in order for j in range(starts[i], starts[i] + counts[i])]
        out["modality_inputs"][name] = _reorder_inputs(inputs, torch.tensor(index, dtype=torch.long))
        out[COUNTS][name] = torch.tensor([sum(counts[i] for i in members) for members in rows], dtype=torch.long)
    return out, PackStats(real=sum(lengths), unpacked=n * seq, packed=len(rows) * pack_length)


class PackedBatches:
    """A demo data set whose global batches come packed; everything else (held-out samples, collate,
    tokenizer, reader state) is the wrapped data set's. Keeps running padding statistics."""

    def __init__(self, data: Any, pack_length: int, row_multiple: int = 1):
        self.data = data
        self.pack_length = pack_length
        self.row_multiple = row_multiple
        self.pad_id = special_ids(data.tok)[2]
        self.stats = PackStats()

    def global_batch(self, step: int, global_batch: int, seed: int) -> dict:
        packed, stats = pack_batch(self.data.global_batch(step, global_batch, seed), self.pad_id, self.pack_length,
                                   self.row_multiple)
        self.stats.add(stats)
        return packed

    def padding_report(self) -> dict[str, float]:
        """Padding fraction of the batches seen so far, padded per sample (before) and packed (after)."""
        return self.stats.report()

    def __getattr__(self, name: str) -> Any:
        # A reader that decodes only this rank's rows (`shard_for`) cannot serve packing, which moves
        # samples between rows: every rank reads the whole global batch instead.
        if name in ("data", "shard_for"):
            raise AttributeError(name)
        return getattr(self.data, name)
