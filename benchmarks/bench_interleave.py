"""The bubble of plain 1F1B against interleaved 1F1B (`parallel.modules.language.virtual_stages`), counted and timed.

Per layout (LM pp, microbatches m, virtual stages v) two figures:

- `counted`: idle / busy of the worst rank under the runtime's own schedule on a clock with equal stage costs
  (`mimo.planner.simulate.schedule_bubble`, which runs `run_1f1b` and `interleaved_order`); the hand formulas
  are (pp - 1) / m and (pp - 1) / (v m).
- `timed`: the same schedule on pp gloo processes. Each rank drives stand-in stages with the runtime's
  schedule functions and its point-to-point messages (`mimo.parallel.p2p`, a [rows, hidden] activation per
  microbatch, the wrap link from the last rank to the first under interleaving); a stage's compute is a sleep
  of forward_ms / v (backward twice that), so stage costs are equal whatever else loads the machine. The
  bubble is step time / ideal - 1, ideal = m x 3 x forward_ms (median of the steps after a warm-up one).

    python -m benchmarks.bench_interleave                  # the demo layouts below
    python -m benchmarks.bench_interleave --pp 2 --micro 4 --chunks 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mimo.parallel.grid import pair_groups
from mimo.parallel.p2p import Outbox, recv_like, send_payload
from mimo.parallel.pipeline.schedule import interleaved_order, run_1f1b, run_interleaved, warmup_microbatches
from mimo.planner.simulate import schedule_bubble

LAYOUTS = [(3, 4, 1), (3, 6, 1), (3, 6, 2), (2, 4, 1), (2, 4, 2), (2, 4, 4)]
"""(LM pp, microbatches, virtual stages): configs/demo_pipeline.toml's LM pp3 over its 4 microbatches (which
interleaving cannot take: 4 is not a multiple of 3), the same over 6 with and without 2 virtual stages, and the
3-rank pipeline of the tests (LM pp2 over 4 microbatches) plain, with 2 and with 4."""
ROWS, HIDDEN = 64, 128


class _SleepChunks:
    """`ChunkedStage` stand-in: chunk k of this rank receives from the previous virtual stage, sleeps, sends on."""

    def __init__(self, rank: int, pp: int, chunks: int, forward_s: float, links: dict, outbox: Outbox):
        self.rank, self.pp, self.chunks, self.forward_s = rank, pp, chunks, forward_s / chunks
        self.links, self.outbox = links, outbox

    def _link(self, chunk: int, step: int) -> tuple[int, dist.ProcessGroup, dist.ProcessGroup] | None:
        """(peer, send group, receive group) towards the virtual stage `step` (+1 or -1) away; None past the ends."""
        v = chunk * self.pp + self.rank + step
        if not 0 <= v < self.pp * self.chunks:
            return None
        wraps = (step > 0 and self.rank == self.pp - 1) or (step < 0 and self.rank == 0)
        return self.links[("wrap_" if wraps else "") + ("next" if step > 0 else "prev")]

    def _exchange(self, recv_from, send_to, seconds: float) -> None:
        buf = torch.empty(ROWS, HIDDEN)
        if recv_from is not None:
            recv_like([buf], recv_from[0], recv_from[2])
        time.sleep(seconds)
        if send_to is not None:
            send_payload([buf], send_to[0], send_to[1], self.outbox)

    def forward(self, t: int, chunk: int = 0) -> None:
        self._exchange(self._link(chunk, -1), self._link(chunk, 1), self.forward_s)

    def backward(self, chunk: int = 0) -> None:
        self._exchange(self._link(chunk, 1), self._link(chunk, -1), 2 * self.forward_s)


def _links(rank: int, pairs: list[tuple[int, int]], names: tuple[str, str]) -> dict:
    """Collective: names[0] (towards the later stage) and names[1] links of this rank along `pairs`, each
    (peer, send group, receive group), with a group per direction (as `PipelinePlan` builds them)."""
    down, up = pair_groups(pairs), pair_groups([(b, a) for a, b in pairs])
    links = {}
    for a, b in pairs:
        if rank == a:
            links[names[0]] = (b, down[(a, b)], up[(b, a)])
        if rank == b:
            links[names[1]] = (a, up[(b, a)], down[(a, b)])
    return links


def _rank(rank: int, pp: int, micro: int, chunks: int, forward_ms: float, steps: int, store: str,
          out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=pp)
    links = _links(rank, [(r, r + 1) for r in range(pp - 1)], ("next", "prev"))
    links.update(_links(rank, [(pp - 1, 0)] if chunks > 1 else [], ("wrap_next", "wrap_prev")))
    stage = _SleepChunks(rank, pp, chunks, forward_ms / 1000, links, Outbox())
    times = []
    for _ in range(steps + 1):
        dist.barrier()
        start = time.perf_counter()
        if chunks > 1:
            run_interleaved(stage, interleaved_order(rank, pp, chunks, micro))
        else:
            run_1f1b(stage, micro, warmup_microbatches(pp, rank, micro))
        stage.outbox.drain()
        dist.barrier()
        times.append(time.perf_counter() - start)
    if rank == 0:
        out["step_s"] = statistics.median(times[1:])
    dist.destroy_process_group()


def timed_bubble(pp: int, micro: int, chunks: int, forward_ms: float, steps: int) -> float:
    """Step time on pp gloo processes over the ideal m x (forward + backward), less 1."""
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        store = os.path.join(tmp, "store")
        mp.spawn(_rank, args=(pp, micro, chunks, forward_ms, steps, store, out), nprocs=pp, join=True)
        return out["step_s"] / (micro * 3 * forward_ms / 1000) - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int)
    ap.add_argument("--micro", type=int)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--forward-ms", type=float, default=200.0, help="one rank's forward of a microbatch")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    layouts = [(args.pp, args.micro, args.chunks)] if args.pp else LAYOUTS
    print("| LM pp | microbatches | virtual stages | hand formula | counted | timed (gloo, sleep stages) |")
    print("|---|---|---|---|---|---|")
    for pp, micro, chunks in layouts:
        idle, busy = schedule_bubble(pp, chunks, micro)
        timed = timed_bubble(pp, micro, chunks, args.forward_ms, args.steps)
        print(f"| {pp} | {micro} | {chunks} | {(pp - 1) / (chunks * micro):.3f} | {idle / busy:.3f} | {timed:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
