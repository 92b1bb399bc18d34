"""bench_native's baseline: transformers' `Qwen2_5_VLForConditionalGeneration` trained on the same batches as mimo.

    python -m benchmarks.hf_native_worker --size full --out DIR [--steps 6 --warmup 2] [--compile] [--grad-ckpt] [--fa2]

What a user would reach for instead of the project, set up as the LLaVA baseline (benchmarks/baseline/
hf_vlm_baseline.py) sets up its model: the model of native_<size>.toml's config (mimo.export.qwen2_vl's
`qwen_vl_hf_config`, so the shapes are mimo's), SDPA attention (`--fa2`: flash_attention_2, where flash_attn
imports), fp32 weights under bf16 autocast, fused AdamW (lr 1e-5), `--compile`: torch.compile of the whole model,
`--grad-ckpt`: gradient checkpointing. Its batches are mimo's (native_workload.native_batches of DIR's manifest, in
transformers' layout, on the device before the first step), its steps bench_vlm.train_step's, timed by
time_steps. Prints one JSON line (native_workload.result_row). CPU threads as the Trainer sets them
(train.threads). The driver, bench_native, writes the manifest first.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.bench_vlm import time_steps, train_step
from benchmarks.native_workload import hf_batch, native_batches, native_config, result_row
from mimo.config.schema import Config, MetricsConfig
from mimo.data.batching import to_device
from mimo.data.tokenizer import require_transformers
from mimo.export.qwen2_vl import ARCHITECTURES, qwen_vl_hf_config
from mimo.hf.load import IMAGES
from mimo.train.threads import set_threads

NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def build_hf_model(cfg: Config, attn: str = "sdpa", device: str | torch.device = "cpu") -> torch.nn.Module:
    """The transformers Qwen-VL model of `cfg.model` (one native_vision modality `images`), randomly initialised in
    fp32 on `device`, with attention `attn` ("sdpa", "flash_attention_2", "eager")."""
    tf = require_transformers()
    m = cfg.model.modalities[IMAGES]
    config = qwen_vl_hf_config(cfg.model.llm, m.native, m.token_id, "float32", NO_IDS, f"model.modalities.{IMAGES}")
    with torch.device(device):
        return getattr(tf, ARCHITECTURES[m.native.family][1])._from_config(config, attn_implementation=attn,
                                                                           dtype=torch.float32)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("full", "tiny"), default="full")
    ap.add_argument("--out", required=True, help="bench_native's folder, whose data/manifest.jsonl it trains on")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--fa2", action="store_true", help="attn_implementation = flash_attention_2 instead of sdpa")
    ap.add_argument("--peak-tflops", type=float, default=MetricsConfig.peak_tflops)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = native_config(args.size, args.out)
    set_threads(cfg.train.threads)  # the host threads the Trainer takes
    batches = native_batches(cfg, args.batches)
    torch.manual_seed(0)
    attn = "flash_attention_2" if args.fa2 else "sdpa"
    model = build_hf_model(cfg, attn, device).train()
    if args.grad_ckpt:
        model.gradient_checkpointing_enable()
    timing = time_steps(train_step(model, [to_device(hf_batch(b), device) for b in batches], device, args.compile),
                        device.type == "cuda", args.warmup, args.steps)
    label = "+".join(["hf-transformers-qwen2.5-vl", attn] + [f for f in ("compile", "grad_ckpt") if getattr(args, f)])
    print(json.dumps(result_row(label, args.size, cfg, batches, timing, model, device, args.peak_tflops,
                                attn=attn, compile=args.compile, grad_ckpt=args.grad_ckpt,
                                transformers=require_transformers().__version__)), flush=True)


if __name__ == "__main__":
    main()
