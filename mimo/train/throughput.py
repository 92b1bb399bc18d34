"""Model FLOP/s per GPU, MFU and peak memory: for each logged row, the progress bar and summary.json.

Rates use host wall time, as tokens/s does: a logged row covers the steps since the previous logged
row, the bar and the summary the whole run. Each step already waits for its loss on the host, so the
wall time covers the device's work. Peak memory is `torch.cuda.max_memory_allocated` of this rank, a
host-side counter (no device sync). On a CPU there is no meaningful peak to compare against, so `mfu`
and `peak_mem_gib` are left out of the rows and the summary.
"""

from __future__ import annotations

import time

import torch


class Throughput:
    """Accumulates each step's tokens and model FLOPs (mimo.models.flops) and turns them into rates: tokens/s
    over all ranks, model TFLOP/s per GPU."""

    def __init__(self, world: int, peak_tflops: float, device: torch.device, start: float):
        self.world = world
        self.peak_tflops = peak_tflops
        self.device = device
        self.start = self.mark = start
        self.total = self.since_mark = self.tokens = 0

    def add(self, flops: int, tokens: int) -> None:
        self.total += flops
        self.since_mark += flops
        self.tokens += tokens

    def tflops(self, flops: int, seconds: float) -> float:
        """Model TFLOP/s per GPU."""
        return flops / max(seconds, 1e-9) / self.world / 1e12

    def stats(self, tflops: float) -> dict[str, float]:
        """`model_tflops`, and on a GPU `mfu` against train.peak_tflops and this rank's `peak_mem_gib`."""
        out = {"model_tflops": tflops}
        if self.device.type == "cuda":
            out["mfu"] = tflops / self.peak_tflops
            out["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return out

    def interval(self) -> dict[str, float]:
        """Stats of the steps since the previous call (or the start), for a logged row."""
        now = time.perf_counter()
        out = self.stats(self.tflops(self.since_mark, now - self.mark))
        self.mark, self.since_mark = now, 0
        return out

    def running(self) -> dict[str, float]:
        """tok/s, TFLOP/s (and MFU on a GPU) since the start, for the progress bar."""
        seconds = time.perf_counter() - self.start
        tflops = self.tflops(self.total, seconds)
        return {"tok_s": self.tokens / seconds, "tflops": tflops,
                **({"mfu": tflops / self.peak_tflops} if self.device.type == "cuda" else {})}

    def summary(self, wall: float) -> dict[str, float]:
        """The run's averages over `wall` seconds for summary.json: tokens/s, and the rest to 4 significant
        digits."""
        return {"tokens_per_s": round(self.tokens / wall, 1),
                **{k: float(f"{v:.4g}") for k, v in self.stats(self.tflops(self.total, wall)).items()}}
