"""MasterAdamW's update alone on a preset's parameters: the compiled pass over the flat gradient buffer
against the Triton kernel that reads the gradients through their addresses, in several launch shapes.

    python -m benchmarks.bench_adamw --preset small [--shape BLOCKxWARPS]...

Gradients are random and stay in place (no backward, no copies), so each row is the update's own device
time: CUDA events around 20 steps after 3 warm-up ones, the median step and the bandwidth it reaches
(bytes the update must move: read gradient, master and moments, write them and the bf16 weights).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.workload import load_preset, model_config
from mimo.hf.build import build_model
from mimo.perf.adamw_triton import TableUpdate
from mimo.perf.master_adamw import MasterAdamW

BYTES_PER_PARAM = 2 + 3 * 4 * 2 + 2  # bf16 gradient in; fp32 master and moments in and out; bf16 weight out


def time_steps(opt: MasterAdamW, steps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of one step, captured as a CUDA graph (so that the host's time to build the address
    table is not on the device's clock)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--shape", action="append", metavar="BLOCKxWARPS",
                    help="a launch shape of the Triton kernel (default: 1024x4, 2048x8, 4096x8)")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shape or ["1024x4", "2048x8", "4096x8"]]
    device = torch.device("cuda")
    torch.manual_seed(0)
    with device:
        model = build_model(model_config(load_preset(args.preset)))
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    rows = []
    for table in (False, True):
        opt = MasterAdamW(params, lr=1e-5, compile=True, grad_table=table)
        for p in params:
            p.grad = torch.randn_like(p)
        if not table:
            rows.append(("compiled, flat gradient buffer", time_steps(opt)))
            continue
        base = opt.table
        for block, warps in shapes:
            opt.table = TableUpdate(base.numels.tolist(), base.offsets.tolist(), device, block=block, warps=warps)
            rows.append((f"Triton, gradient table, {block} x {warps} warps", time_steps(opt)))
        del opt
    print(f"preset `{args.preset}`: {n / 1e9:.3f} B parameters, {torch.cuda.get_device_name()}\n")
    print("| update | ms a step | TB/s |\n|---|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} | {n * BYTES_PER_PARAM / ms / 1e9:.2f} |")


if __name__ == "__main__":
    main()
