"""Balanced data lanes (`data.balance_lanes`): the global batch's rows reordered so that every data lane,
and every microbatch of it, gets about the same estimated work, with the global batch itself unchanged.

`mimo.data.batching` gives microbatch t the contiguous run t of the global batch and each module's DP
lane a contiguous slice of it, so the finest unit of work is a *bin*: microbatch t's slice l of
`lanes` equal slices, `lanes` being the least common multiple of the modules' DP degrees (every module's
lane is a run of consecutive bins). Reordering the rows moves samples between bins without changing
any bin's size, any module's slicing, or the set of samples of the step. The loss is a sum over the
global batch's tokens divided by the global token count (SPEC 3.1), so the loss and the gradients are
those of the unbalanced step up to the order of float additions.

Cost of a row (its estimated forward FLOPs, `mimo.models.flops`' conventions, from the model config's
shapes): the LM over the row's S tokens (`lm_flops`, quadratic attention term included) plus, for each
encoder input the row holds, the encoder over that input's positions with the quadratic attention term
(`vit_flops` per image: (image / patch)^2 patches and the class token; `audio_flops` per clip;
`native_flops` per image or video of a native-resolution tower, from its `grid_thw`; `anyres_flops` per image
of an anyres modality, from its `image_sizes` and `tiled` flags: each of its tiles, the count the data path
cuts) and the projector (or patch merger) over the rows it keeps. Rows of one batch share one length, so the LM
term is the same for every row and the assignment is driven by the encoder term (images per sample and
their sizes); it still enters the imbalance figure's mean.

Assignment: longest processing time first under the equal-size constraint. Rows sorted by cost,
descending (ties: the earlier row first), each goes to the least loaded bin that still has room (ties:
the lowest bin); inside a bin rows keep their batch order. If that leaves the most loaded lane (then
the most loaded bin) no lighter than the batch's own order does, the batch order is kept, so balancing
never makes a step's lane imbalance worse. Pure integer arithmetic on the host: every rank that holds
the batch computes the same order without communication, on resume too (the order is a function of the
batch alone).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import torch

from mimo.config.schema import ModelConfig
from mimo.data.batching import COUNTS, input_counts
from mimo.models.anyres import image_layout
from mimo.models.audio import AudioEncoder
from mimo.models.flops import anyres_flops, audio_flops, lm_flops, native_flops, projector_flops, vit_flops
from mimo.models.sample_rows import OUTPUT_LENGTHS


def input_costs(cfg: ModelConfig, name: str, encoder_inputs: dict[str, dict[str, torch.Tensor]]) -> list[int]:
    """Estimated forward FLOPs of each input of modality `name` in the batch (encoder and projector)."""
    m, lm_hidden = cfg.modalities[name], cfg.llm.hidden
    kwargs = next(iter(encoder_inputs.values()), {})
    if m.kind == "native_vision":
        return [native_flops(m.native, tuple(item), lm_hidden) for item in kwargs["grid_thw"].tolist()]
    if m.kind == "audio":
        features = kwargs["input_features"]
        frames = features.shape[-1]
        lengths = kwargs.get(OUTPUT_LENGTHS)
        kept = lengths.tolist() if lengths is not None else [AudioEncoder.output_frames(frames)] * features.shape[0]
        return [audio_flops(m.audio, frames) + projector_flops(m.audio.hidden, lm_hidden, int(k)) for k in kept]
    if m.anyres_grid_pinpoints:
        return [anyres_flops(m, size, lm_hidden, tiled) for size, tiled in zip(*image_layout(kwargs))]
    n = next((v.shape[0] for v in kwargs.values() if isinstance(v, torch.Tensor)), 0)
    return [vit_flops(m.vit) + projector_flops(m.vit.hidden, lm_hidden, m.vit.tokens_per_image)] * n


def row_costs(cfg: ModelConfig, batch: dict) -> list[int]:
    """Estimated forward FLOPs of each row of a global batch (see the module docstring)."""
    n, seq = batch["input_ids"].shape
    costs = [lm_flops(cfg.llm, seq)] * n
    for name, encoder_inputs in batch.get("modality_inputs", {}).items():
        per_input = iter(input_costs(cfg, name, encoder_inputs))
        counts = input_counts(batch, name).tolist()
        costs = [c + sum(itertools.islice(per_input, k)) for c, k in zip(costs, counts)]
    return costs


def bin_loads(costs: Sequence[int], bins: int) -> list[int]:
    """Summed cost of each of `bins` equal contiguous slices of `costs`."""
    size = len(costs) // bins
    return [sum(costs[b * size:(b + 1) * size]) for b in range(bins)]


def lpt_bins(costs: Sequence[int], bins: int) -> list[list[int]]:
    """Row indices of each of `bins` bins of len(costs) / bins rows: longest processing time first, each row
    to the least loaded bin with room (ties: the lowest bin); each bin's rows in ascending order."""
    if bins < 1 or len(costs) % bins:
        raise ValueError(f"{len(costs)} rows do not split into {bins} equal bins")
    room = len(costs) // bins
    heap = [(0, b) for b in range(bins)]  # (load, bin) of the bins that still have room
    members: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, b = heapq.heappop(heap)
        members[b].append(i)
        if len(members[b]) < room:
            heapq.heappush(heap, (load + costs[i], b))
    return [sorted(m) for m in members]


def balanced_order(costs: Sequence[int], lanes: int, microbatches: int) -> list[int]:
    """A permutation of the rows (new row r is old row order[r]) whose `lanes x microbatches` contiguous
    equal slices are the LPT bins, or the identity where that leaves the most loaded lane, then the most
    loaded bin, no lighter than the batch order does."""
    bins = lanes * microbatches
    order = [i for members in lpt_bins(costs, bins) for i in members]
    if _peaks([costs[i] for i in order], lanes, microbatches) < _peaks(costs, lanes, microbatches):
        return order
    return list(range(len(costs)))


def lane_loads(costs: Sequence[int], lanes: int, microbatches: int) -> list[int]:
    """Each data lane's step cost, rows in batch order: lane l sums bin l of every microbatch."""
    loads = bin_loads(costs, lanes * microbatches)
    return [sum(loads[t * lanes + lane] for t in range(microbatches)) for lane in range(lanes)]


def _peaks(costs: Sequence[int], lanes: int, microbatches: int) -> tuple[int, int]:
    return max(lane_loads(costs, lanes, microbatches)), max(bin_loads(costs, lanes * microbatches))


def lane_imbalance(costs: Sequence[int], lanes: int, microbatches: int) -> float:
    """max / mean of the data lanes' step costs, rows in batch order (1.0 when no row costs anything)."""
    per_lane = lane_loads(costs, lanes, microbatches)
    mean = sum(per_lane) / lanes
    return max(per_lane) / mean if mean > 0 else 1.0


def take_rows(batch: dict, order: Sequence[int]) -> dict:
    """The batch with its rows in `order`: every per-row tensor (dim 0), `modality_counts`, and each
    modality's flat inputs regrouped so that they follow their rows (an anyres modality's `pixel_values`
    `[images, most tiles, ...]`, `image_sizes` and `tiled` by image, each image's tiles and zero padding with it)."""
    index = torch.tensor(order, dtype=torch.long)
    out = {k: _index_tree(v, index) for k, v in batch.items() if k not in ("modality_inputs", COUNTS)}
    if "modality_inputs" in batch:
        out["modality_inputs"] = {}
        for name, inputs in batch["modality_inputs"].items():
            counts = input_counts(batch, name).tolist()
            starts = [0, *itertools.accumulate(counts)]
            flat = [j for i in order for j in range(starts[i], starts[i] + counts[i])]
            out["modality_inputs"][name] = _index_tree(inputs, torch.tensor(flat, dtype=torch.long))
    if COUNTS in batch:
        out[COUNTS] = {name: c.index_select(0, index.to(c.device)) for name, c in batch[COUNTS].items()}
    return out


def _index_tree(tree: Any, index: torch.Tensor) -> Any:
    if isinstance(tree, dict):
        return {k: _index_tree(v, index) for k, v in tree.items()}
    if isinstance(tree, torch.Tensor):
        return tree.index_select(0, index.to(tree.device))
    return tree


LANE_KEYS = ("lane_imbalance_before", "lane_imbalance", "bin_imbalance_before", "bin_imbalance")
"""A balanced step's metrics: max / mean of the lanes' step costs in the batch's own order and as trained, and
the same of the bins' (one lane's share of one microbatch: what a pipeline stage waits on)."""


class LaneBalancer:
    """Reorders each global batch for `lanes` data lanes (the lcm of the modules' DP degrees) and
    `microbatches` microbatches, and keeps the lane imbalance of every batch it saw. Not collective."""

    def __init__(self, cfg: ModelConfig, lanes: int, microbatches: int):
        self.cfg, self.lanes, self.microbatches = cfg, lanes, microbatches
        self.seen: list[dict[str, float]] = []

    def __call__(self, batch: dict) -> tuple[dict, dict[str, float]]:
        """(the reordered batch, its LANE_KEYS figures)."""
        costs = row_costs(self.cfg, batch)
        order = balanced_order(costs, self.lanes, self.microbatches)
        orders = (costs, [costs[i] for i in order])
        lanes = [lane_imbalance(c, self.lanes, self.microbatches) for c in orders]
        bins = [lane_imbalance(c, self.lanes * self.microbatches, 1) for c in orders]
        figures = dict(zip(LANE_KEYS, (round(x, 6) for x in (*lanes, *bins))))
        self.seen.append(figures)
        return (batch if order == list(range(len(order))) else take_rows(batch, order)), figures

    def summary(self) -> dict:
        """summary.json's `lane_imbalance`: the lanes and microbatches balanced, the first batch's figures
        and the mean of each figure over the batches seen (this run segment's)."""
        out: dict = {"lanes": self.lanes, "microbatches": self.microbatches}
        if self.seen:
            out.update({f"first_{k}": self.seen[0][k] for k in LANE_KEYS})
            out.update({f"mean_{k}": round(sum(f[k] for f in self.seen) / len(self.seen), 6) for k in LANE_KEYS})
        return out
