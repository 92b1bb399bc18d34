"""Train a Qwen2.5-VL-shaped model on images of mixed sizes with `mimo train`'s Trainer, and transformers'
Qwen2.5-VL on the same batches, in one invocation: the native-resolution throughput figure.

    python -m benchmarks.bench_native --out DIR [--size full|tiny] [--steps 6 --warmup 2] [--timeout 300]
        [--mimo OVERRIDES]... [--baseline FLAGS]...

On one H200: `python -m benchmarks.bench_native --out runs/bench_native` (2.2 B parameters, see
benchmarks/presets/native_full.toml; `--size tiny` is the CPU tests' miniature). Expected there: mimo's run ~100 s
(its first step compiles, ~60 s) at ~82 GiB (`mimo plan benchmarks/presets/native_full.toml --gpus 1`: 33 GiB of
weights, gradients and AdamW states, 47 GiB of activations), each eager transformers run ~40 s at ~90-100 GiB (16 B
a parameter too, plus fp32 logits of 8,192 x 151,936 and their gradient); `--baseline compile` adds ~150 s.

The data (benchmarks/native_workload.py): a seeded JSONL manifest of PNGs that the driver writes under DIR/data, one
global batch of rows, row 0 with one large image, every other row with two or three small ones; each side trains on
the same `--batches` global batches that mimo's data pipeline makes of it (steps 0, 1, ...), cycled, like the LLaVA
baseline's pre-made batches (no reading inside a timed step). The mimo side is `Trainer` on native_<size>.toml with
`--mimo`'s overrides (bench_vlm.build_trainer: off CUDA the CUDA-only keys are turned off), each step
`Trainer.train_step`, timed by bench_vlm.timed_steps (synchronise around each step, median after warm-up). The
baseline (benchmarks/hf_native_worker.py) is `Qwen2_5_VLForConditionalGeneration` of the same config, fp32 weights
under bf16 autocast, fused AdamW, timed the same way. Both count tokens as rows x seq_len and model FLOPs by
mimo.models.flops (native_workload.step_flops).

`--mimo` takes comma-separated dotted overrides of the TOML (`A|B`: B only if A failed); default DEFAULT_MIMO.
`--baseline` takes the worker's switches, comma-separated: `compile`, `grad-ckpt`, `fa2` (flash_attention_2 instead
of SDPA); default eager SDPA, and `fa2` too where flash_attn imports. Every run is a subprocess of its own (clean
peak memory; a failure or a timeout is a table row). The table goes to stdout (last) and DIR/native_<size>.md,
one JSON line per run to DIR/native_<size>.jsonl, every run's output to DIR/native_<size>.log.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from benchmarks import bench_vlm as vlm
from benchmarks.native_workload import (
    CycledBatches,
    manifest_path,
    native_batches,
    preset,
    result_row,
    write_manifest,
)
from mimo.config.schema import MetricsConfig

DEFAULT_MIMO = "|perf.attention_backend=efficient|perf.attention_backend=efficient,perf.encoder_compile=blocks"
"""The TOML as shipped (cuDNN attention, the tower compiled whole); if that fails, memory-efficient attention
(which takes any mask); then the tower left uncompiled too (the LM's blocks compiled)."""


def worker(args: argparse.Namespace) -> dict:
    """Train mimo on the manifest's batches in this process; its JSON row."""
    spec = ",".join(filter(None, [f"data.path={manifest_path(args.out)}", args.options]))
    trainer = vlm.build_trainer(preset(args.size), spec, Path(args.out) / "runs", args.warmup + args.steps + 1)
    batches = native_batches(trainer.cfg, args.batches, trainer.data)
    trainer.data = CycledBatches(batches)
    timing = vlm.timed_steps(trainer, args.warmup, args.steps)
    return result_row(vlm.mimo_label(args.options, 1), args.size, trainer.cfg, batches,
                      timing, trainer.model, trainer.device, args.peak_tflops,
                      train=vlm.ran_keys(trainer.cfg))


def mimo_cmd(args: argparse.Namespace, spec: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.bench_native", "--worker", *common_args(args), "--options", spec]


def hf_cmd(args: argparse.Namespace, flags: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.hf_native_worker", *common_args(args), *vlm.switches(flags)]


def common_args(args: argparse.Namespace) -> list[str]:
    return ["--size", args.size, "--out", args.out, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--batches", str(args.batches), "--peak-tflops", str(args.peak_tflops)]


def default_baselines() -> list[str]:
    """Eager SDPA; flash_attention_2 as well where flash_attn imports (transformers' fastest attention)."""
    return [""] + (["fa2"] if importlib.util.find_spec("flash_attn") is not None else [])


def verdict(rows: list[dict], baselines: list[dict]) -> str:
    """The headline: the fastest mimo row over the fastest baseline (the acceptance figure, >= 1.3x)."""
    ran, hf = [r for r in rows if "error" not in r], [b for b in baselines if "error" not in b]
    if not ran or not hf:
        return "no ratio: a side has no row"
    best, fastest = max(ran, key=lambda r: r["tokens_per_s"]), max(hf, key=lambda b: b["tokens_per_s"])
    return (f"{best['label']} / {fastest['label']} (the fastest baseline): "
            f"{best['tokens_per_s'] / fastest['tokens_per_s']:.2f}x")


def driver(args: argparse.Namespace, baseline_flags: list[str] | None) -> None:
    """The manifest, then every mimo spec's run (its alternatives in turn) and every baseline's (None:
    default_baselines()), then the table."""
    out, name = Path(args.out), preset(args.size)
    write_manifest(args.size, out, args.seed)
    specs = args.mimo if args.mimo is not None else [DEFAULT_MIMO]
    flags = baseline_flags if baseline_flags is not None else default_baselines()
    jobs = [([(vlm.mimo_label(a, 1), mimo_cmd(args, a)) for a in s.split("|")], False) for s in specs]
    jobs += [([(vlm.baseline_label(f), hf_cmd(args, f))], True) for f in flags]
    rows, baselines = vlm.run_logged(out, name, jobs, args.timeout, args.fail_fast)
    text = (f"`{name}` (benchmarks/presets/{name}.toml), {args.batches} batches of mixed image sizes cycled, "
            f"{args.steps} timed steps after {args.warmup} warm-up; tokens: rows x seq_len; "
            "'per GPU x' columns: tokens/s over the baseline's\n\n")
    text += vlm.table(rows + baselines, baselines) + "\n\n" + verdict(rows, baselines)
    (out / f"{name}.md").write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("full", "tiny"), default="full")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batches", type=int, default=2, help="distinct global batches, cycled (mimo's steps 0, 1, ...)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the manifest's image sizes, pixels and text")
    ap.add_argument("--peak-tflops", type=float, default=MetricsConfig.peak_tflops, help="dense bf16 peak, for MFU")
    ap.add_argument("--mimo", action="append", metavar="OVERRIDES",
                    help=f"dotted overrides of the TOML to run (repeatable; 'A|B': B if A failed); default "
                         f"'{DEFAULT_MIMO}'")
    ap.add_argument("--baseline", action="append", metavar="FLAGS",
                    help="baseline switches (compile, grad-ckpt, fa2), comma-separated (repeatable); '' = eager SDPA; "
                         "default: '' and, where flash_attn imports, 'fa2'")
    vlm.add_driver_args(ap, "runs/bench_native", 300)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batches < 1:
        ap.error(f"--steps and --batches must be >= 1 and --warmup >= 0, got {args.steps}, {args.batches} and "
                 f"{args.warmup}")
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    driver(args, [] if args.no_baseline else args.baseline)


if __name__ == "__main__":
    main()
