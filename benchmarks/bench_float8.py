"""FP8 against bf16 on a preset, in one invocation: throughput and the loss curve on the same batches.

    python -m benchmarks.bench_float8 --preset small --steps 300 --variant "" \
        --variant "precision.module_dtype.language=float8" [--variant "40:..."] [--out DIR] [--budget S]

Each variant is comma-separated dotted overrides of benchmarks/presets/<preset>.toml (as bench_vlm's `--mimo`),
optionally led by `N:` for its own step count, "A|B" for a fallback B run only if A failed. Every variant runs
`mimo train`'s Trainer in a subprocess of its own (bench_vlm.build_trainer: the same seeds, so the same
synthetic batches), times each `Trainer.train_step` (synchronised; the median after `--warmup` steps) and
keeps each step's loss. The first variant is the reference: each other row gives its tokens/s over the
reference's and the largest relative gap of its loss to the reference's, both smoothed by a moving mean of
`--smooth` steps, over the steps both ran; and whether every loss was finite. `--budget` seconds cap the
whole invocation (a variant gets what is left, less 10 s). The table goes to stdout and DIR/<preset>_float8.md,
one JSON line per run (the losses included) to DIR/<preset>_float8.jsonl, every run's output to its .log.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.bench_vlm import build_trainer
from benchmarks.launch import run_row
from benchmarks.workload import load_preset


def worker(args: argparse.Namespace) -> dict:
    """The variant `args.options` for `args.steps` steps in this process: timing, memory and every loss."""
    p = load_preset(args.preset)
    trainer = build_trainer(args.preset, args.options, Path(args.out) / "runs", args.steps)
    times, losses = [], []
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    for i in range(args.steps):
        sync()
        t0 = time.perf_counter()
        losses.append(trainer.train_step(i)["loss"])
        sync()
        times.append(time.perf_counter() - t0)
        print(f"step {i} {times[-1]:.4f} s loss {losses[-1]:.4f}", file=sys.stderr, flush=True)  # kept on a timeout
    step = statistics.median(times[args.warmup:])
    t = trainer.cfg.precision
    return {"options": args.options, "steps": args.steps, "step_s_median": round(step, 5),
            "tokens_per_s": round(p["micro_batch"] * p["seq_len"] / step, 1), "first_step_s": round(times[0], 2),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else 0.0,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "module_dtype": dict(t.module_dtype), "float8_recipe": t.float8_recipe, "losses": losses}


def smoothed(values: list[float], window: int) -> list[float]:
    """The trailing moving mean of `values` over `window` entries (fewer at the start)."""
    return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def compare(row: dict, ref: dict, window: int) -> dict:
    """tokens/s over the reference's, and the largest smoothed relative loss gap over the steps both ran."""
    n = min(len(row["losses"]), len(ref["losses"]))
    finite = all(math.isfinite(x) for x in row["losses"])
    if not finite:
        return {"ratio": row["tokens_per_s"] / ref["tokens_per_s"], "finite": False, "gap": math.inf, "n": n}
    a, b = smoothed(row["losses"][:n], window), smoothed(ref["losses"][:n], window)
    return {"ratio": row["tokens_per_s"] / ref["tokens_per_s"], "finite": True, "n": n,
            "gap": max(abs(x - y) / abs(y) for x, y in zip(a, b))}


def table(rows: list[dict], window: int) -> str:
    ok = [r for r in rows if "error" not in r]
    ref = ok[0] if ok else None
    head = "| variant | steps | tokens/s | step (s) | first step (s) | peak GiB | x reference | loss @1 | loss @last " \
           f"| max rel gap (smoothed {window}) | finite |\n|---|---|---|---|---|---|---|---|---|---|---|"
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['error']} |" + " |" * 9)
            continue
        c = compare(r, ref, window)
        lines.append(f"| {r['label']} | {r['steps']} | {r['tokens_per_s']:,.0f} | {r['step_s_median']:.4f} | "
                     f"{r['first_step_s']:.1f} | {r['peak_mem_gib']:.1f} | {c['ratio']:.3f} | {r['losses'][0]:.4f} | "
                     f"{r['losses'][-1]:.4f} | {c['gap']:.2e} (over {c['n']}) | {c['finite']} |")
    return "\n".join(lines)


def worker_cmd(args: argparse.Namespace, spec: str, steps: int) -> list[str]:
    return [sys.executable, "-m", "benchmarks.bench_float8", "--worker", "--preset", args.preset, "--options", spec,
            "--steps", str(steps), "--warmup", str(args.warmup), "--out", args.out]


def driver(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log, jsonl = out / f"{args.preset}_float8.log", out / f"{args.preset}_float8.jsonl"
    end = time.monotonic() + args.budget
    rows = []
    for variant in args.variant:
        for spec in variant.split("|"):
            head, sep, rest = spec.partition(":")
            steps, options = (head, rest) if sep and head.isdigit() else ("", spec)
            left = end - time.monotonic() - 10
            if left < 30:
                rows.append({"label": options or "preset as shipped", "error": "skipped: --budget spent"})
                break
            label = options or "preset as shipped"
            print(f"running {label} ({left:.0f} s left) ...", flush=True)
            r = {**run_row(worker_cmd(args, options, int(steps or args.steps)), label, log, left), "label": label}
            print(json.dumps({k: v for k, v in r.items() if k != "losses"}), flush=True)
            with jsonl.open("a") as f:
                f.write(json.dumps(r) + "\n")
            rows.append(r)
            if "error" not in r:
                break
    text = f"preset `{args.preset}`, median step after {args.warmup} warm-up steps; reference: the first row\n\n"
    text += table(rows, args.smooth)
    (out / f"{args.preset}_float8.md").write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--variant", action="append", default=None)
    ap.add_argument("--smooth", type=int, default=20)
    ap.add_argument("--budget", type=float, default=3600.0)
    ap.add_argument("--out", default="runs/bench_float8")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--options", default="")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
    else:
        args.variant = args.variant if args.variant is not None else ["", "precision.module_dtype.language=float8"]
        driver(args)


if __name__ == "__main__":
    main()
