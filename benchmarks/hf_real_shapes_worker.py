"""bench_real_shapes' baseline: transformers' LLaVA trained on the same batches of LLaVA-1.5's mix as mimo.

    python -m benchmarks.hf_real_shapes_worker --size small --out DIR [--batches 4 --steps 8 --warmup 4] [--compile]

The model is the one benchmarks/baseline/hf_vlm_baseline.py builds for the preset (its own `build_model`: CLIP
tower, MLP projector, Qwen2 decoder, SDPA, fp32 weights), trained as it trains (bf16 autocast, fused AdamW, lr
1e-5; bench_vlm.train_step), `--compile`: torch.compile of the whole model. Its batches are real_shapes'
(draw_batches with the driver's seed), each right-padded to its longest sample with an attention mask
(real_shapes.hf_batch), on the device before the first step; timed by bench_vlm.time_steps. Prints one JSON line
(real_shapes.throughput_row). CPU threads as the Trainer sets them (train.threads' default).
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.bench_real_shapes import add_workload_args, check_workload_args
from benchmarks.bench_vlm import time_steps, train_step
from benchmarks.real_shapes import draw_batches, hf_batch, hf_padding, throughput_row
from benchmarks.workload import baseline_module, load_preset
from mimo.config.schema import TrainConfig
from mimo.data.batching import to_device
from mimo.data.tokenizer import require_transformers
from mimo.train.threads import set_threads


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(ap)
    ap.add_argument("--out", required=True, help="bench_real_shapes' folder (unused: the batches are drawn here)")
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args(argv)
    check_workload_args(ap, args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    set_threads(TrainConfig.threads)  # the host threads the Trainer takes
    batches = [hf_batch(b) for b in draw_batches(args.size, args.batches, args.global_batch, args.seed)]
    torch.manual_seed(0)
    model, _ = baseline_module().build_model(load_preset(args.size), device)
    model.train()
    step = train_step(model, [to_device({k: v for k, v in b.items() if v is not None}, device) for b in batches],
                      device, args.compile)
    timing = time_steps(step, device.type == "cuda", args.warmup, args.steps)
    label = "hf-transformers-llava" + ("+compile" if args.compile else "")
    print(json.dumps(throughput_row(hf_padding(batches), args.batches, timing, device, model, system=label,
                                    size=args.size, compile=args.compile,
                                    transformers=require_transformers().__version__)), flush=True)


if __name__ == "__main__":
    main()
