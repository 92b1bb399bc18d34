"""Train an MoE VLM with `mimo train`'s Trainer and the same model in Hugging Face transformers, in one invocation.

    python -m benchmarks.bench_moe --out runs/bench_moe [--size full|tiny] [--steps 6 --warmup 2]
        [--timeout 240] [--budget 480] [--mimo OVERRIDES]... [--baseline FLAGS]... [--no-baseline] [--fail-fast]

The H200 command (one GPU, one invocation: mimo, then hf eager, hf bf16-weights and hf compile in turn, each at
most --timeout seconds and all of them --budget seconds, so that the call ends within a 10-minute limit):

    python -m benchmarks.bench_moe --out runs/bench_moe --size full --steps 6 --warmup 2 --timeout 240 --budget 480

Expected: ~100 s for mimo (its first step compiles, ~60 s), ~50 s for each eager transformers row and ~200 s for
the compiled one (cold torch.compile ~150 s), ~400 s in all (`--baseline compile` alone halves that). Peak
memory on one H200 (141 GiB): mimo ~94 GiB (`mimo plan benchmarks/presets/moe_small.toml --gpus 1`: 44.7 GiB of
weights, gradients and AdamW states at 16 B a parameter, ~48 GiB of activations); transformers more, ~110-120
GiB by a hand count, not measured (16 B a parameter too, but under autocast its experts' activations are fp32,
and its full fp32 logits take ~20 GiB).

The workload is benchmarks/presets/moe_small.toml (`--size full`, 3.0 B parameters: the `small` preset's ViT, an
MLP projector and a Qwen3-MoE-shaped LM of 24 layers, hidden 2048, 16 experts of width 768 each, top-2, vocab
151,936; 8 samples of 2,048 tokens a step) or moe_tiny.toml (`--size tiny`, for the CPU test). The mimo row is
`Trainer.train_step` on that TOML with every fast path `mimo train` allows for experts on one GPU (bench_vlm's
`build_trainer`, `timed_steps`); the baseline rows are benchmarks/hf_moe_worker.py: transformers'
LlavaForConditionalGeneration over a Qwen3MoeConfig built from the same TOML (tests/unit/test_bench_moe.py holds
the two losses equal on the same weights and batch), bf16 autocast over fp32 weights, fused AdamW, eager and
`--baseline compile` (torch.compile of the model), and `--baseline bf16-weights`: on bf16 weights without
autocast, the only way transformers runs its experts as bf16 grouped GEMMs (under autocast it casts their input
to the fp32 weights, and torch's fp32 grouped_mm loops over the experts); bf16 AdamW state, less precise than
mimo's fp32 master weights. Its row is there so that the ratio is not read off a slow fp32 path alone.

Both sides time their steps alike (synchronise around each, median after warm-up) and share one FLOPs count,
mimo.models.flops.train_step_flops (the VLM baseline's convention): 3 x forward, 2 FLOPs per multiply-add; per
LM token 2 x (layers x (attention weights + router + top_k x 3 hidden moe_mlp) + hidden x vocab), i.e. the
active parameters only (2 of the 16 experts), plus causal attention at half; the ViT and projector as in the
VLM benchmark. MFU is against --peak-tflops (989, the H200's dense bf16 peak). Each run is a subprocess of its
own (clean peak memory; an out-of-memory run is a row). `--mimo "A|B"` runs B only if A failed (DEFAULT_MIMO).
The table goes to stdout (last) and to DIR/moe_<size>.md, one JSON line per run to DIR/moe_<size>.jsonl, every
run's output to DIR/moe_<size>.log.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.bench_vlm import (
    PRESETS,
    add_driver_args,
    baseline_label,
    build_trainer,
    mimo_label,
    ran_keys,
    run_logged,
    switches,
    table,
    throughput_fields,
    timed_steps,
)
from mimo.config.load import load_config
from mimo.config.schema import Config, MetricsConfig
from mimo.models.flops import feed_forward_params, train_step_flops

SIZES = {"full": "moe_small", "tiny": "moe_tiny"}
"""--size: the TOML of benchmarks/presets/ it runs."""
DEFAULT_MIMO = ["|perf.compile=false|perf.compile=false,perf.grad_table=false"]
"""The TOML as shipped; only if that run failed, without compilation; only if that failed too, without the
Triton AdamW table (the row's label names what ran, the log why the one before failed)."""
DEFAULT_BASELINES = ["", "bf16-weights", "compile"]
"""transformers under the VLM baseline's precision contract (bf16 autocast over fp32 weights) eager, on bf16
weights eager (its experts' bf16 grouped GEMMs), and compiled under autocast, last (the longest, ~150 s cold)."""
MODALITY = "images"


def moe_config(size: str) -> Config:
    """The workload's config as shipped (the HF worker reads its model and data shapes from it)."""
    return load_config(PRESETS / f"{SIZES[size]}.toml")


def step_work(cfg: Config) -> tuple[int, int]:
    """(tokens, model FLOPs) of one step of `cfg`'s synthetic batch: data.global_batch samples of data.seq_len
    tokens, one image each (shapes only, on the meta device)."""
    d, vit = cfg.data, cfg.model.modalities[MODALITY].vit
    batch = {"input_ids": torch.empty(d.global_batch, d.seq_len, device="meta"),
             "modality_inputs": {MODALITY: {"vit": {"pixel_values": torch.empty(
                 d.global_batch * d.images_per_sample, vit.channels, vit.image, vit.image, device="meta")}}}}
    return d.global_batch * d.seq_len, train_step_flops(cfg.model, batch)


def active_params(cfg: Config) -> int:
    """Matmul weights one LM token passes: attention, router, its top_k experts and the head (what the FLOPs count
    at 2 per token per forward)."""
    llm = cfg.model.llm
    attention = 2 * llm.hidden * (llm.heads + llm.kv_heads) * llm.attention_head_dim
    return sum(attention + feed_forward_params(llm, i) for i in range(llm.layers)) + llm.hidden * llm.vocab


def result_fields(timing: dict, cfg: Config, model: torch.nn.Module, device: torch.device, peak: float) -> dict:
    """One row's measured fields from `time_steps`'s timing, shared by the mimo and the Hugging Face rows."""
    return throughput_fields(timing, *step_work(cfg), model, device, peak)


def worker(args: argparse.Namespace) -> dict:
    """mimo's row: `Trainer.train_step` on the size's TOML with `args.options` (off CUDA the CUDA-only keys off)."""
    trainer = build_trainer(SIZES[args.size], args.options, Path(args.out) / "runs", args.warmup + args.steps)
    timing = timed_steps(trainer, args.warmup, args.steps)
    fields = result_fields(timing, trainer.cfg, trainer.model, trainer.device, args.peak_tflops)
    return {"system": mimo_label(args.options, 1), "size": args.size, **fields,
            "train": ran_keys(trainer.cfg)}


def common_args(args: argparse.Namespace) -> list[str]:
    return ["--size", args.size, "--steps", str(args.steps), "--warmup", str(args.warmup), "--peak-tflops",
            str(args.peak_tflops)]


def mimo_cmd(args: argparse.Namespace, spec: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.bench_moe", "--worker", "--options", spec, "--out", args.out,
            *common_args(args)]


def baseline_cmd(args: argparse.Namespace, flags: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.hf_moe_worker", *common_args(args), *switches(flags)]


def header(args: argparse.Namespace) -> str:
    cfg = moe_config(args.size)
    llm, d = cfg.model.llm, cfg.data
    return (f"MoE VLM `{SIZES[args.size]}` (LM {llm.layers} layers, hidden {llm.hidden}, {llm.moe_experts} experts "
            f"top-{llm.moe_top_k} of width {llm.moe_mlp}; {active_params(cfg) / 1e6:,.0f} M LM matmul weights "
            f"active per token), {d.global_batch} x {d.seq_len} tokens a step, {args.steps} timed steps after "
            f"{args.warmup} warm-up; FLOPs count the active experts only; 'per GPU x' columns: mimo's tokens/s over "
            "each Hugging Face row's\n\n")


def driver(args: argparse.Namespace) -> None:
    out, stem = Path(args.out), SIZES[args.size]
    specs = args.mimo if args.mimo is not None else DEFAULT_MIMO
    flags = [] if args.no_baseline else args.baseline if args.baseline is not None else DEFAULT_BASELINES
    jobs = [([(mimo_label(a, 1), mimo_cmd(args, a)) for a in s.split("|")], False) for s in specs]
    jobs += [([(baseline_label(f), baseline_cmd(args, f))], True) for f in flags]
    rows, baselines = run_logged(out, stem, jobs, args.timeout, args.fail_fast, budget=args.budget)
    text = header(args) + table(rows + baselines, baselines)
    (out / f"{stem}.md").write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, default=MetricsConfig.peak_tflops, help="dense bf16 peak, for MFU")
    ap.add_argument("--mimo", action="append", metavar="OVERRIDES",
                    help=f"dotted overrides of the TOML to run (repeatable); default: {DEFAULT_MIMO}")
    ap.add_argument("--baseline", action="append", metavar="FLAGS",
                    help=f"hf_moe_worker switches to run (repeatable); '' = eager; default: {DEFAULT_BASELINES}")
    add_driver_args(ap, "runs/bench_moe", 240)
    ap.add_argument("--budget", type=float, default=480,
                    help="seconds allowed to all the runs together (a run out of time may take 60 s more to stop); "
                         "those left without time are skipped rows")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        ap.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
    else:
        driver(args)


if __name__ == "__main__":
    main()
