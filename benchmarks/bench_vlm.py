"""Train mimo's VLM on a preset of presets.json and run the Hugging Face baseline in the same invocation.

    python -m benchmarks.bench_vlm --preset small [--mimo SPEC]... [--baseline FLAGS]... [--nproc N]... [--out DIR]

Every system runs in its own subprocess (clean peak-memory figures; an out-of-memory run is a table row,
not a crash). `--mimo` takes Options fields, e.g. `--mimo ""` (all optimisations), `--mimo
"sdpa=flash,ckpt_layers=12"`, or fallbacks `--mimo "|ckpt_layers=12"` (the second only if the first
failed); `--baseline` takes the baseline's switches, e.g. `--baseline ""` (eager) or `--baseline
"grad-ckpt,compile"`. The table goes to stdout (last) and to DIR/<preset>.md, one JSON line per run to
DIR/<preset>.jsonl, every run's output to DIR/<preset>.log.

`--nproc N` runs mimo data-parallel on N GPUs through torchrun (repeat it for a scaling table, e.g.
`--nproc 1 --nproc 2`): every rank trains the same model on micro-batches of its own, and MasterAdamW
shards its fp32 state over the ranks (ZeRO-1). Its collectives are not captured in a CUDA graph, so such
an invocation replays each compiled region as CUDA graphs instead of the whole step (`step_graph=0`), on
one GPU too. Such a row's tokens/s is the global throughput, its MFU and model TFLOP/s are per GPU, and
its ratio to a baseline (which always runs on one GPU) is per GPU: tokens/s per GPU over the baseline's
tokens/s.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.launch import run_row
from benchmarks.runner import Options, Run
from benchmarks.workload import BASELINE_SCRIPT, load_preset, make_batches, train_flops_per_sample
from mimo.config.schema import TrainConfig
from mimo.parallel.runtime import init_distributed, leave_distributed, torchrun_cmd

DEFAULT_BASELINES = {"small": ["", "compile"], "medium": ["grad-ckpt", "grad-ckpt,compile"]}


def worker(args: argparse.Namespace) -> dict | None:
    """Train mimo on the preset in this process, one rank of a data-parallel group when torchrun started
    it; on rank 0 return the baseline's JSON fields plus a few more (throughput global, FLOP/s per GPU),
    elsewhere None (one row per run)."""
    p = load_preset(args.preset)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    rank, ranks = init_distributed(device_type)
    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    # Data-parallel ranks replay their compiled regions as CUDA graphs instead of capturing the whole step
    # (collectives are not captured); so does every row of a scaling table, to compare like with like.
    graphs = {"step_graph": False, "vit_compile": "graphs", "lm_compile": "graphs", "lm_update_early": False,
              "grad_table": False} \
        if ranks > 1 or args.region_graphs else {}
    opts = Options.parse(args.options, compile=device.type == "cuda", **graphs)
    run = Run(p, opts, device, group=dist.group.WORLD if ranks > 1 else None)
    batches = make_batches(p, device, seed=1 + rank)
    timing = run.measure(batches, args.warmup, args.steps)
    if args.profile:  # every rank profiles (the step is collective); each writes its own trace
        name = (re.sub(r"[^A-Za-z0-9=]+", "_", args.options) or "default") + (f"_rank{rank}" if ranks > 1 else "")
        trace = Path(args.trace_dir) / f"{args.preset}_{name}.json"
        trace.parent.mkdir(parents=True, exist_ok=True)
        text = run.profile(batches[0], trace)
        if rank == 0:
            print(f"profile of mimo [{args.options}] (trace: {trace})\n{text}", file=sys.stderr, flush=True)
    syncs = run.host_syncs(batches[0])
    tflops = train_flops_per_sample(p) * p["micro_batch"] / timing["step_s_median"] / 1e12
    tokens_per_gpu = p["micro_batch"] * p["seq_len"] / timing["step_s_median"]
    out = {
        "system": "mimo" + (f" [{args.options}]" if args.options else ""),
        "preset": args.preset,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "gpus": ranks,
        "step_s_median": round(timing["step_s_median"], 5),
        "tokens_per_s": round(ranks * tokens_per_gpu, 1),
        "tokens_per_s_per_gpu": round(tokens_per_gpu, 1),
        "model_tflops": round(tflops, 2),
        "mfu": round(tflops / args.peak_tflops, 4),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
        "params_m": round(sum(t.numel() for t in run.model.parameters()) / 1e6, 1),
        "final_loss": round(timing["final_loss"], 4),
        "issue_s_median": round(timing["issue_s_median"], 5),
        "first_step_s": round(timing["first_step_s"], 2),
        "host_syncs": syncs,
        "options": {**vars(opts), "step_graph": run.graphed},  # whether the step was captured, in effect
    }
    if not math.isfinite(out["final_loss"]):
        raise RuntimeError(f"loss is not finite: {out['final_loss']}")
    leave_distributed()
    return out if rank == 0 else None


def mimo_cmd(args: argparse.Namespace, spec: str, nproc: int) -> list[str]:
    """The worker's command line; through torchrun for more than one GPU. When any run of the invocation is
    data-parallel, every run compiles its regions as CUDA graphs (`--region-graphs`), as data parallelism
    must, so that the one-GPU row of a scaling table runs the same step."""
    launch = torchrun_cmd(nproc) if nproc > 1 else [sys.executable]
    return [*launch, "-m", "benchmarks.bench_vlm", "--worker", "--preset", args.preset, "--options",
            spec, "--steps", str(args.steps), "--warmup", str(args.warmup), "--peak-tflops", str(args.peak_tflops),
            *(["--region-graphs"] if max(args.nproc or [1]) > 1 else []),
            *(["--profile", "--trace-dir", args.trace_dir or str(Path(args.out) / "traces")] if args.profile else [])]


def baseline_cmd(args: argparse.Namespace, flags: str) -> list[str]:
    switches = [f"--{f.strip()}" for f in flags.split(",") if f.strip()]
    return [sys.executable, str(BASELINE_SCRIPT), "--preset", args.preset, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--peak-tflops", str(args.peak_tflops), *switches]


def mimo_label(spec: str, nproc: int) -> str:
    return "mimo" + (f" [{spec}]" if spec else "") + (f" on {nproc} GPUs" if nproc > 1 else "")


def baseline_label(flags: str) -> str:
    return "hf " + (flags.replace(",", "+") if flags else "eager")


def table(rows: list[dict], baselines: list[dict]) -> str:
    """Markdown: one row per system, with its throughput per GPU over each baseline variant that ran (the
    baseline's rows, from its own script, are single-GPU and have no per-GPU fields)."""
    ran = [b for b in baselines if "error" not in b]
    head = ["system", "GPUs", "tokens/s", "tokens/s per GPU", "model TFLOP/s per GPU", "MFU", "peak GiB"]
    head += [f"per GPU x {b['label']}" for b in ran]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            cells = [r["label"], r["error"]] + [""] * (len(head) - 2)
        else:
            per_gpu = r.get("tokens_per_s_per_gpu", r["tokens_per_s"])
            peak = "" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"
            cells = [r["label"], str(r.get("gpus", 1)), f"{r['tokens_per_s']:,.0f}", f"{per_gpu:,.0f}",
                     f"{r['model_tflops']:.0f}", f"{100 * r['mfu']:.1f}%", peak]
            cells += [f"{per_gpu / b['tokens_per_s']:.2f}" for b in ran]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log, jsonl = out / f"{args.preset}.log", out / f"{args.preset}.jsonl"
    log.write_text("")
    jsonl.write_text("")
    specs = args.mimo if args.mimo is not None else [""]
    nprocs = args.nproc or [1]
    flags = args.baseline if args.baseline is not None else DEFAULT_BASELINES.get(args.preset, [""])
    # A mimo spec "A|B" runs B only if A failed (e.g. "|ckpt_layers=12": checkpointing only if needed).
    jobs = [([(mimo_label(a, n), mimo_cmd(args, a, n)) for a in s.split("|")], False) for s in specs for n in nprocs]
    jobs += [([(baseline_label(f), baseline_cmd(args, f))], True) for f in flags]
    rows, baselines = [], []
    for alternatives, is_baseline in jobs:
        if is_baseline and args.fail_fast and rows and all("error" in r for r in rows):
            print(f"skipping {alternatives[0][0]}: every mimo run failed (--fail-fast)", flush=True)
            continue
        for label, cmd in alternatives:
            print(f"running {label} ...", flush=True)
            r = {"system": label, **run_row(cmd, label, log, args.timeout), "label": label}
            print(json.dumps(r), flush=True)
            with jsonl.open("a") as f:
                f.write(json.dumps(r) + "\n")
            (baselines if is_baseline else rows).append(r)
            if "error" not in r:
                break
    text = (f"preset `{args.preset}`, {args.steps} timed steps after {args.warmup} warm-up; tokens/s over all GPUs, "
            "'per GPU x' columns: tokens/s per GPU over the baseline's tokens/s (one GPU)\n\n")
    text += table(rows + baselines, baselines)
    (out / f"{args.preset}.md").write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=TrainConfig.peak_tflops, help="dense bf16 peak, for MFU")
    ap.add_argument("--mimo", action="append", metavar="SPEC",
                    help="mimo Options to run (repeatable); default: one run with all optimisations")
    ap.add_argument("--baseline", action="append", metavar="FLAGS",
                    help="baseline switches to run (repeatable); '' = eager; default per preset: "
                         + "; ".join(f"{k}: {v}" for k, v in DEFAULT_BASELINES.items()) + "; others: ['']")
    ap.add_argument("--nproc", action="append", type=int, metavar="N",
                    help="GPUs of each mimo run, data-parallel through torchrun (repeatable, for a scaling table); "
                         "default 1. The baselines always run on one GPU")
    ap.add_argument("--no-baseline", action="store_true", help="run mimo only")
    ap.add_argument("--out", default="runs/bench", help="folder for the table, the JSON lines and the log")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed to each run")
    ap.add_argument("--fail-fast", action="store_true", help="skip the baselines when every mimo run failed")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, profile one mimo step and log its most expensive kernels")
    ap.add_argument("--trace-dir", help="where --profile writes Chrome traces (default: OUT/traces)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--options", default="", help=argparse.SUPPRESS)
    ap.add_argument("--region-graphs", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.no_baseline:
        args.baseline = []
    if any(n < 1 for n in args.nproc or []):
        ap.error(f"--nproc takes a number of GPUs >= 1, got {args.nproc}")
    if args.worker:
        out = worker(args)
        if out is not None:
            print(json.dumps(out), flush=True)
    else:
        driver(args)


if __name__ == "__main__":
    main()
