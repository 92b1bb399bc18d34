"""Model FLOP/s per GPU, MFU and peak memory: for each logged row, the progress bar and summary.json.

Rates use host wall time, as tokens/s does: a logged row covers the steps since the previous logged
row, the summary the whole run. Each step already waits for its loss on the host, so the wall time covers
the device's work. Besides the whole run's rates (compilation, autotuning and a CUDA graph's capture in
them), the bar and the summary give the steady state: the rates over the steps after the first
`metrics.throughput_warmup` of this run, once they are past (the `steady_*` fields). Peak memory is
`torch.cuda.max_memory_allocated` of this rank, a host-side counter (no device sync). On a CPU there is no
meaningful peak to compare against, so `mfu` and `peak_mem_gib` are left out of the rows and the summary.
"""

from __future__ import annotations

import time

import torch


class Throughput:
    """Accumulates each step's tokens and model FLOPs (mimo.models.flops) and turns them into rates: tokens/s
    over all ranks, model TFLOP/s per GPU. The steady state starts after the first `warmup` steps added."""

    def __init__(self, world: int, peak_tflops: float, device: torch.device, start: float, warmup: int = 0):
        self.world = world
        self.peak_tflops = peak_tflops
        self.device = device
        self.start = self.mark = start
        self.total = self.since_mark = self.tokens = 0
        self.warmup, self.steps = warmup, 0
        self.steady_start: float | None = start if warmup == 0 else None
        self.steady_flops = self.steady_tokens = self.steady_steps = 0

    def add(self, flops: int, tokens: int) -> None:
        """Count one finished step (call it after the step's loss reached the host)."""
        self.total += flops
        self.since_mark += flops
        self.tokens += tokens
        self.steps += 1
        if self.steady_start is None:
            if self.steps == self.warmup:
                self.steady_start = time.perf_counter()
            return
        self.steady_flops += flops
        self.steady_tokens += tokens
        self.steady_steps += 1

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` of work that is no training step (a periodic evaluation) out of the rates: the
        logged interval and the steady state start that much later (the run's averages over its wall time
        keep it)."""
        self.mark += seconds
        if self.steady_start is not None:
            self.steady_start += seconds

    def tflops(self, flops: int, seconds: float) -> float:
        """Model TFLOP/s per GPU."""
        return flops / max(seconds, 1e-9) / self.world / 1e12

    def stats(self, tflops: float) -> dict[str, float]:
        """`model_tflops`, and on a GPU `mfu` against metrics.peak_tflops and this rank's `peak_mem_gib`."""
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
        """For the progress bar: tok/s, TFLOP/s (and MFU on a GPU) of the steady state once a steady step
        has run, else since the start (the warm-up steps); `wall_s` since the start, warm-up included."""
        now = time.perf_counter()
        steady = self.steady_start is not None and self.steady_steps > 0
        seconds = now - self.steady_start if steady else now - self.start
        tokens, flops = (self.steady_tokens, self.steady_flops) if steady else (self.tokens, self.total)
        tflops = self.tflops(flops, seconds)
        return {"tok_s": tokens / max(seconds, 1e-9), "tflops": tflops,
                **({"mfu": tflops / self.peak_tflops} if self.device.type == "cuda" else {}),
                "wall_s": now - self.start}

    def summary(self, wall: float) -> dict[str, float]:
        """The run's averages over `wall` seconds for summary.json (tokens/s, and the rest to 4 significant
        digits), then the steady state's: `steady_steps`, `steady_s` and `steady_tokens_per_s`,
        `steady_model_tflops`, `steady_mfu` (on a GPU) over them; without a steady step, only `steady_steps`
        = 0."""
        out = {"tokens_per_s": round(self.tokens / wall, 1),
               **{k: float(f"{v:.4g}") for k, v in self.stats(self.tflops(self.total, wall)).items()},
               "steady_steps": self.steady_steps}
        if self.steady_steps:
            seconds = self.start + wall - self.steady_start  # `wall` runs from `start`
            rates = self.stats(self.tflops(self.steady_flops, seconds))
            out.update({"steady_s": round(seconds, 3), "steady_tokens_per_s": round(self.steady_tokens / seconds, 1),
                        "steady_model_tflops": float(f"{rates['model_tflops']:.4g}")})
            if "mfu" in rates:
                out["steady_mfu"] = float(f"{rates['mfu']:.4g}")
        return out
