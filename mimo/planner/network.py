"""Bandwidth-latency models of the collectives a step runs (what `mimo plan` charges for communication).

A group of n ranks moving B bytes (the size of one rank's full tensor):

    all-reduce       2 (n-1)/n B / bw + 2 (n-1) lat      (ring: a reduce-scatter, then an all-gather)
    all-gather       (n-1)/n B / bw + (n-1) lat          (B = the gathered tensor)
    reduce-scatter   (n-1)/n B / bw + (n-1) lat          (B = the tensor before it is scattered)
    all-to-all       (n-1)/n B / bw + (n-1) lat          (B = what one rank sends and keeps; MoE dispatch)
    uneven exchange  B / bw + (n-1) lat                  (an all-to-all whose busiest rank sends or receives B)
    send             B / bw + lat                        (one pipeline or bridge message)
    host copy        B / host_bw                         (device <-> pinned host memory, over the GPU's PCIe link)

bw and lat are the NVLink figures when every rank of the group sits on one node, else the network's (one
NIC per GPU, so a group spanning nodes runs at the per-GPU network bandwidth). Rank r sits on node
r // gpus_per_node; grids place tp fastest, then cp, dp, pp (parallel/grid.py), so a group is the ranks
offset + stride * i.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Network:
    """Link figures: bandwidths in GB/s per GPU and direction (what one rank can move), latencies in seconds."""

    nvlink_gbps: float = 360.0
    nvlink_latency_s: float = 5e-6
    network_gbps: float = 45.0
    network_latency_s: float = 15e-6
    gpus_per_node: int = 8
    host_gbps: float = 53.5
    """A GPU's PCIe link to pinned host memory: an H100 SXM's Gen5 x16 copied 1-4 GiB at 55.0 GB/s to the host and
    52.0 back, alone on its node (torch copy_, non_blocking); 53.5 is their harmonic mean, so a copy out and back
    costs what the two measured. Eight GPUs copying at once may share switch uplinks (not measured)."""

    def spans_nodes(self, first: int, stride: int, size: int) -> bool:
        """Whether the ranks first + stride * i (i < size) sit on more than one node."""
        last = first + stride * (size - 1)
        return first // self.gpus_per_node != last // self.gpus_per_node

    def link(self, first: int, stride: int, size: int) -> tuple[float, float]:
        """(bytes per second, latency) of a group of ranks first + stride * i."""
        if self.spans_nodes(first, stride, size):
            return self.network_gbps * 1e9, self.network_latency_s
        return self.nvlink_gbps * 1e9, self.nvlink_latency_s

    def all_reduce(self, nbytes: float, first: int, stride: int, size: int) -> float:
        if size <= 1 or nbytes <= 0:
            return 0.0
        bw, lat = self.link(first, stride, size)
        return 2 * (size - 1) / size * nbytes / bw + 2 * (size - 1) * lat

    def all_gather(self, nbytes: float, first: int, stride: int, size: int) -> float:
        if size <= 1 or nbytes <= 0:
            return 0.0
        bw, lat = self.link(first, stride, size)
        return (size - 1) / size * nbytes / bw + (size - 1) * lat

    reduce_scatter = all_gather
    """The same cost as an all-gather of the unscattered tensor."""
    all_to_all = all_gather
    """Each rank keeps 1/n of its B bytes and sends the rest: the same bytes on the wire as an all-gather."""

    def exchange(self, nbytes: float, first: int, stride: int, size: int) -> float:
        """An all-to-all of uneven splits whose busiest rank sends or receives `nbytes`."""
        if size <= 1 or nbytes <= 0:
            return 0.0
        bw, lat = self.link(first, stride, size)
        return nbytes / bw + (size - 1) * lat

    def send(self, nbytes: float, src: int, dst: int) -> float:
        """One point-to-point message from rank src to rank dst."""
        if nbytes <= 0 or src == dst:
            return 0.0
        bw, lat = self.link(min(src, dst), abs(dst - src), 2)
        return nbytes / bw + lat

    def host_copy(self, nbytes: float) -> float:
        """Copying `nbytes` between one GPU and pinned host memory, one way."""
        return max(nbytes, 0.0) / (self.host_gbps * 1e9)
