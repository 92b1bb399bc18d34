"""Block-diagonal attention over a packed sequence without an `[N, N]` mask: each segment (a frame of an item, or
a Qwen2.5-VL window of one) attends to itself only.

`segments(ids)` groups the segments by length once per forward, on the host: a permutation of the patches that
puts every segment's patches together (segments of one length side by side), its inverse, and the (segments,
length) of each group. `segment_attention` then gathers q, k and v once, runs one unmasked SDPA per group on
`[segments, heads, length, dim]`, and gathers the outputs back into packed order. Nothing in it reads the device:
the groups are Python ints and two index tensors, so the blocks make no host syncs. The cost is the segments'
own (sum of length^2), not N^2; with few distinct lengths (windows are at most window^2 patches and ragged only
at a frame's right and bottom edges) it is a handful of kernels per block.

`segment_attention` stays outside torch.compile: its loop over the groups would make Dynamo recompile a block for
every new grouping, i.e. every batch of new image sizes, until its recompile limit; outside, a compiled block is
two graphs (up to the attention, after it) that every batch reuses. It is marked with `torch._disable_dynamo`, the
lazy form of `torch.compiler.disable` (which torch's own optimizers use): Dynamo is imported at the first call,
not when mimo is imported, so importing a checkpoint does not hold Dynamo's 0.14 GiB resident.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Segments:
    """Patches grouped by segment: `perm` `[N]` lists them segment after segment (groups of equal length one
    after the other), `inverse` `[N]` undoes it, `groups` holds each group's (segments, length)."""

    perm: torch.Tensor
    inverse: torch.Tensor
    groups: tuple[tuple[int, int], ...]

    def to(self, device: torch.device) -> Segments:
        return Segments(self.perm.to(device), self.inverse.to(device), self.groups)


def segments(ids: torch.Tensor) -> Segments:
    """`Segments` of the packed patches whose segment ids `[N]` (integers, equal = same segment) are `ids`; a
    segment's patches keep their packed order."""
    _, seg, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    order = torch.argsort(seg, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    perm, groups = [], []
    for length in sorted(set(counts.tolist())):
        first = starts[counts == length]
        perm.append(order[first[:, None] + torch.arange(length)].reshape(-1))
        groups.append((len(first), length))
    perm = torch.cat(perm) if perm else torch.zeros(0, dtype=torch.long)
    return Segments(perm, torch.argsort(perm), tuple(groups))


@torch._disable_dynamo
def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segs: Segments) -> torch.Tensor:
    """Softmax attention of `[N, heads, D]` q, k, v within each segment of `segs` (scale 1/sqrt(D)), `[N, heads, D]`
    in packed order: what SDPA over the whole sequence with a same-segment mask gives."""
    heads, dim = q.shape[1:]
    sizes = [g * n for g, n in segs.groups]
    parts = [t[segs.perm].split(sizes) for t in (q, k, v)]
    outs = []
    for (g, n), qg, kg, vg in zip(segs.groups, *parts):
        qg, kg, vg = (t.view(g, n, heads, dim).transpose(1, 2) for t in (qg, kg, vg))
        outs.append(F.scaled_dot_product_attention(qg, kg, vg).transpose(1, 2).reshape(g * n, heads, dim))
    return torch.cat(outs)[segs.inverse]
