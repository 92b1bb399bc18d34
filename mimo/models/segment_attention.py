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

On CUDA in half precision it runs instead one variable-length flash attention over all segments at once
(`torch.nn.attention.varlen.varlen_attn`, where PyTorch has it): the permuted patches are the segments one after
another, `cu_seqlens` their boundaries, so a block is one kernel whatever the mix of lengths, with nothing to
compile per batch (FlexAttention's block mask would be compiled for every new patch count). The grouped SDPA path
stays the reference (CPU, fp32, older PyTorch) the tests compare it against.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Segments:
    """Patches grouped by segment: `perm` `[N]` lists them segment after segment (groups of equal length one
    after the other), `inverse` `[N]` undoes it, `groups` holds each group's (segments, length), `cu_seqlens`
    `[segments + 1]` (int32) where each segment starts in `perm`'s order and ends, `longest` the longest one."""

    perm: torch.Tensor
    inverse: torch.Tensor
    groups: tuple[tuple[int, int], ...]
    cu_seqlens: torch.Tensor
    longest: int

    def to(self, device: torch.device) -> Segments:
        return Segments(self.perm.to(device), self.inverse.to(device), self.groups, self.cu_seqlens.to(device),
                        self.longest)


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
    lengths = torch.tensor([n for g, n in groups for _ in range(g)], dtype=torch.int32)
    cu_seqlens = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return Segments(perm, torch.argsort(perm), tuple(groups), cu_seqlens, max((n for _, n in groups), default=0))


@functools.cache
def varlen_kernel() -> Callable | None:
    """PyTorch's variable-length flash attention, or None where this PyTorch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segs: Segments,
                             kernel: Callable) -> torch.Tensor:
    """`segment_attention` through `kernel`, which takes `varlen_attn`'s arguments (`[T, heads, D]` q, k, v,
    cumulative sequence starts and longest lengths of the queries and the keys): one call for every segment."""
    out = kernel(q[segs.perm], k[segs.perm], v[segs.perm], segs.cu_seqlens, segs.cu_seqlens, segs.longest,
                 segs.longest)
    return out[segs.inverse]


@torch._disable_dynamo
def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segs: Segments) -> torch.Tensor:
    """Softmax attention of `[N, heads, D]` q, k, v within each segment of `segs` (scale 1/sqrt(D)), `[N, heads, D]`
    in packed order: what SDPA over the whole sequence with a same-segment mask gives. On CUDA in fp16 or bf16
    `varlen_segment_attention` with PyTorch's `varlen_attn`, where it has one; else `grouped_segment_attention`."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and varlen_kernel() is not None:
        return varlen_segment_attention(q, k, v, segs, varlen_kernel())
    return grouped_segment_attention(q, k, v, segs)


def grouped_segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segs: Segments) -> torch.Tensor:
    """`segment_attention` as one unmasked SDPA per group of equal-length segments: the reference path."""
    heads, dim = q.shape[1:]
    sizes = [g * n for g, n in segs.groups]
    parts = [t[segs.perm].split(sizes) for t in (q, k, v)]
    outs = []
    for (g, n), qg, kg, vg in zip(segs.groups, *parts):
        qg, kg, vg = (t.view(g, n, heads, dim).transpose(1, 2) for t in (qg, kg, vg))
        outs.append(F.scaled_dot_product_attention(qg, kg, vg).transpose(1, 2).reshape(g * n, heads, dim))
    return torch.cat(outs)[segs.inverse]
