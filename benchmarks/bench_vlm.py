"""Train mimo's VLM on a preset of presets.json with `mimo train`'s Trainer, and run the Hugging Face baseline
in the same invocation.

    python -m benchmarks.bench_vlm --preset small [--mimo OVERRIDES]... [--baseline FLAGS]... [--nproc N]... [--out DIR]

The mimo side is `Trainer` built from the TOML preset shipped beside this file (benchmarks/presets/<preset>.toml,
one per workload of presets.json), each of its steps `Trainer.train_step`, timed as the baseline times its
steps (synchronise around each, median after warm-up); tokens/s, model TFLOP/s and MFU use the baseline's own
FLOPs formula. Every system runs in its own subprocess (clean peak-memory figures; an out-of-memory run is a
table row, not a crash). `--mimo` takes comma-separated dotted overrides of the preset, e.g. `--mimo ""` (the
preset as shipped: every fast path), `--mimo "perf.compile=false,perf.grad_table=false"`, or fallbacks
`--mimo '|perf.activation_checkpointing=["language"]'` (the second only if the first failed); `--baseline`
takes the baseline's switches, e.g. `--baseline ""` (eager) or `--baseline "grad-ckpt,compile"`. The table goes
to stdout (last) and to DIR/<preset>.md, one JSON line per run to DIR/<preset>.jsonl, every run's output to
DIR/<preset>.log.

Off CUDA the CUDA-only keys are turned off (`CPU_OFF`). `--nproc N` runs mimo data-parallel on N GPUs through
torchrun (repeat it for a scaling table): the one-process keys (mimo.perf.apply.ONE_PROCESS_ONLY) are turned off
on every row of such an invocation, so that the rows run the same step (`precision.master_weights` stays on, its fp32
state sharded ZeRO-1 over the ranks). Such a row's tokens/s is the global throughput, its MFU and model TFLOP/s
are per GPU, and its ratio to a baseline (which always runs on one GPU) is per GPU: tokens/s per GPU over the
baseline's tokens/s.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from benchmarks.launch import run_row
from benchmarks.workload import BASELINE_SCRIPT, load_preset, train_flops_per_sample
from mimo.config.load import load_config
from mimo.config.schema import Config, MetricsConfig
from mimo.parallel.runtime import torchrun_cmd
from mimo.perf.apply import ONE_PROCESS_ONLY
from mimo.train.trainer import Trainer

PRESETS = Path(__file__).resolve().parent / "presets"
DEFAULT_BASELINES = {"small": ["", "compile"], "medium": ["grad-ckpt", "grad-ckpt,compile"]}
CPU_OFF = ("train.device=cpu", "perf.grad_table=false", "perf.compile=false")
"""Overrides of every row off CUDA: the keys that need a GPU (and compilation, minutes on a CPU)."""
DATA_PARALLEL_OFF = tuple(f"perf.{key}=false" for key in ONE_PROCESS_ONLY)
TRAIN_KEYS = ("train.device", "precision.dtype", "perf.compile", "perf.encoder_compile", "perf.chunked_loss",
              "perf.loss_rows_only", "perf.fuse_qkv", "perf.attention_backend", "precision.master_weights",
              "perf.grad_table", "perf.activation_checkpointing")
"""The config keys each mimo row records (what ran), under their names without the section."""


def ran_keys(cfg: Config) -> dict:
    """{key without its section: value} of TRAIN_KEYS in `cfg` (a row's "train" record)."""
    return {key.split(".")[1]: getattr(getattr(cfg, key.split(".")[0]), key.split(".")[1]) for key in TRAIN_KEYS}


def preset_overrides(spec: str) -> list[str]:
    """`"a.b=1,c.d=x"` as `mimo train` overrides; a value may hold commas inside brackets (`["language"]`)."""
    items, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [f"--{item.strip()}" for item in items if item.strip()]


def build_trainer(preset: str, spec: str, out: Path, steps: int, data_parallel: bool = False) -> Trainer:
    """`Trainer` on benchmarks/presets/<preset>.toml with `spec`'s overrides, for `steps` steps, writing under
    `out`; CPU_OFF where there is no GPU, DATA_PARALLEL_OFF (before `spec`) under data parallelism."""
    forced = [*(DATA_PARALLEL_OFF if data_parallel else ()), *(() if torch.cuda.is_available() else CPU_OFF)]
    cfg = load_config(PRESETS / f"{preset}.toml", [*preset_overrides(",".join(forced)), *preset_overrides(spec),
                                                   f"--train.steps={steps}", f"--run.out_dir={out}"])
    return Trainer(cfg)


def time_steps(step: Callable[[int], float | torch.Tensor], cuda: bool, warmup: int, steps: int) -> dict:
    """`step(i)` (it returns the step's loss) for warm-up + timed steps, timed as the baseline times its steps
    (synchronise around each, median after warm-up); their mean, the first step's time (compilation) and the last
    loss too."""
    times, first, loss = [], 0.0, float("nan")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        loss = step(i)
        sync()
        if i == 0:
            first = time.perf_counter() - t0
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return {"step_s_median": statistics.median(times), "step_s_mean": statistics.fmean(times), "first_step_s": first,
            "final_loss": float(loss)}


def train_step(model: torch.nn.Module, batches: list[dict], device: torch.device, compile_model: bool = False,
               opt: torch.optim.Optimizer | None = None, autocast: bool = True) -> Callable[[int], torch.Tensor]:
    """A Hugging Face baseline's step i for `time_steps`, as hf_vlm_baseline.py makes it: the model's loss on
    batch i modulo their number (torch.compile'd with `compile_model`) under bf16 autocast (none without
    `autocast`), its backward, `opt`'s step (default AdamW, lr 1e-5, torch's defaults otherwise, fused on CUDA)
    and zeroed gradients."""
    fwd = torch.compile(model) if compile_model else model
    opt = opt if opt is not None else torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")

    def step(i: int) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16) if autocast else nullcontext():
            loss = fwd(**batches[i % len(batches)]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def throughput_fields(timing: dict, tokens: int, flops: float, model: torch.nn.Module, device: torch.device,
                      peak_tflops: float) -> dict:
    """One run's measured fields from `time_steps`'s `timing`, a step's `tokens` and model `flops`: throughput,
    MFU against `peak_tflops`, peak memory (CUDA), parameters, the last loss and the first step's time. Raises
    RuntimeError on a non-finite loss."""
    step_s = timing["step_s_median"]
    tflops = flops / step_s / 1e12
    cuda = device.type == "cuda"
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "step_s_median": round(step_s, 5), "tokens_per_s": round(tokens / step_s, 1),
           "model_tflops": round(tflops, 2), "mfu": round(tflops / peak_tflops, 4),
           "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
           "params_m": round(sum(x.numel() for x in model.parameters()) / 1e6, 1),
           "final_loss": round(timing["final_loss"], 4), "first_step_s": round(timing["first_step_s"], 2)}
    if not math.isfinite(out["final_loss"]):
        raise RuntimeError(f"loss is not finite: {out['final_loss']}")
    return out


def timed_steps(trainer: Trainer, warmup: int, steps: int) -> dict:
    """`Trainer.train_step` timed by `time_steps`."""
    return time_steps(lambda i: trainer.train_step(i)["loss"], trainer.device.type == "cuda", warmup, steps)


def profile_step(trainer: Trainer, step: int, trace: Path, rows: int = 30) -> str:
    """The kernels of one more step, most device time first; its Chrome trace is written to `trace`."""
    cuda = trainer.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        trainer.train_step(step)
        if cuda:
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70)


def worker(args: argparse.Namespace) -> dict | None:
    """Train mimo on the preset in this process, one rank of a data-parallel group when torchrun started
    it; on rank 0 return the baseline's JSON fields plus a few more (throughput global, FLOP/s per GPU),
    elsewhere None (one row per run)."""
    p = load_preset(args.preset)
    out = Path(args.out) / "runs"
    with build_trainer(args.preset, args.options, out, args.warmup + args.steps + 1, args.data_parallel) as trainer:
        # the block leaves the process group it joined (under torchrun) when it ends
        ranks, device = trainer.world, trainer.device
        timing = timed_steps(trainer, args.warmup, args.steps)
        if args.profile:  # every rank profiles (the step is collective); each writes its own trace
            name = "".join(c if c.isalnum() or c == "=" else "_" for c in args.options) or "default"
            trace = Path(args.trace_dir) / f"{args.preset}_{name}_rank{trainer.rank}.json"
            trace.parent.mkdir(parents=True, exist_ok=True)
            text = profile_step(trainer, args.warmup + args.steps, trace)
            if trainer.is_main:
                print(f"profile of mimo [{args.options}] (trace: {trace})\n{text}", file=sys.stderr, flush=True)
    tflops = train_flops_per_sample(p) * p["micro_batch"] / timing["step_s_median"] / 1e12
    tokens_per_gpu = p["micro_batch"] * p["seq_len"] / timing["step_s_median"]
    result = {
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
        "params_m": round(sum(x.numel() for x in trainer.model.parameters()) / 1e6, 1),
        "final_loss": round(timing["final_loss"], 4),
        "first_step_s": round(timing["first_step_s"], 2),
        "train": ran_keys(trainer.cfg),
    }
    if not math.isfinite(result["final_loss"]):
        raise RuntimeError(f"loss is not finite: {result['final_loss']}")
    return result if trainer.is_main else None


def mimo_cmd(args: argparse.Namespace, spec: str, nproc: int) -> list[str]:
    """The worker's command line; through torchrun for more than one GPU. When any run of the invocation is
    data-parallel, every run turns the one-process keys off (`--data-parallel`), so that the one-GPU row of a
    scaling table runs the same step."""
    launch = torchrun_cmd(nproc) if nproc > 1 else [sys.executable]
    return [*launch, "-m", "benchmarks.bench_vlm", "--worker", "--preset", args.preset, "--options",
            spec, "--steps", str(args.steps), "--warmup", str(args.warmup), "--peak-tflops", str(args.peak_tflops),
            "--out", args.out, *(["--data-parallel"] if max(args.nproc or [1]) > 1 else []),
            *(["--profile", "--trace-dir", args.trace_dir or str(Path(args.out) / "traces")] if args.profile else [])]


def switches(flags: str) -> list[str]:
    """A baseline's comma-separated FLAGS as its worker's switches ("compile,grad-ckpt" -> --compile --grad-ckpt)."""
    return [f"--{f.strip()}" for f in flags.split(",") if f.strip()]


def baseline_cmd(args: argparse.Namespace, flags: str) -> list[str]:
    return [sys.executable, str(BASELINE_SCRIPT), "--preset", args.preset, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--peak-tflops", str(args.peak_tflops), *switches(flags)]


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


Job = tuple[list[tuple[str, list[str]]], bool]
"""(alternatives: (label, command) each run only if the one before failed, whether it is a baseline)."""


def run_jobs(jobs: list[Job], log: Path, jsonl: Path, timeout: float, fail_fast: bool,
             budget: float = math.inf) -> tuple[list[dict], list[dict]]:
    """Run every job's alternatives until one gives a row (each in its own subprocess, `timeout` seconds each,
    less where fewer of the `budget` seconds of all the runs are left; a run with none left is a skipped row),
    appending each row to `jsonl` and each run's output to `log`; (system rows, baseline rows). `fail_fast`
    skips the baselines when every system row failed."""
    rows, baselines, start = [], [], time.monotonic()
    for alternatives, is_baseline in jobs:
        if is_baseline and fail_fast and rows and all("error" in r for r in rows):
            print(f"skipping {alternatives[0][0]}: every mimo run failed (--fail-fast)", flush=True)
            continue
        for label, cmd in alternatives:
            left = min(timeout, budget - (time.monotonic() - start))
            print(f"running {label} ...", flush=True)
            r = run_row(cmd, label, log, left) if left >= 1 else {"error": "skipped: no time left of --budget"}
            r = {"system": label, **r, "label": label}
            print(json.dumps(r), flush=True)
            with jsonl.open("a") as f:
                f.write(json.dumps(r) + "\n")
            (baselines if is_baseline else rows).append(r)
            if "error" not in r:
                break
    return rows, baselines


def run_logged(out: Path, stem: str, jobs: list[Job], timeout: float, fail_fast: bool,
               budget: float = math.inf) -> tuple[list[dict], list[dict]]:
    """`run_jobs` into `out` (made if missing), which holds only this invocation's STEM.log and STEM.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    log, jsonl = out / f"{stem}.log", out / f"{stem}.jsonl"
    log.write_text("")
    jsonl.write_text("")
    return run_jobs(jobs, log, jsonl, timeout, fail_fast, budget)


def driver(args: argparse.Namespace) -> None:
    out = Path(args.out)
    specs = args.mimo if args.mimo is not None else [""]
    nprocs = args.nproc or [1]
    flags = args.baseline if args.baseline is not None else DEFAULT_BASELINES.get(args.preset, [""])
    # A mimo spec "A|B" runs B only if A failed (e.g. "|ckpt_layers=12": checkpointing only if needed).
    jobs = [([(mimo_label(a, n), mimo_cmd(args, a, n)) for a in s.split("|")], False) for s in specs for n in nprocs]
    jobs += [([(baseline_label(f), baseline_cmd(args, f))], True) for f in flags]
    rows, baselines = run_logged(out, args.preset, jobs, args.timeout, args.fail_fast)
    text = (f"preset `{args.preset}`, {args.steps} timed steps after {args.warmup} warm-up; tokens/s over all GPUs, "
            "'per GPU x' columns: tokens/s per GPU over the baseline's tokens/s (one GPU)\n\n")
    text += table(rows + baselines, baselines)
    (out / f"{args.preset}.md").write_text(text + "\n")
    print(text)


def add_driver_args(ap: argparse.ArgumentParser, out: str, timeout: float) -> None:
    """The switches every benchmark of mimo against a baseline takes: --no-baseline, --out, --timeout, --fail-fast,
    and the hidden --worker (this process is one run) with its --options (the mimo run's overrides)."""
    ap.add_argument("--no-baseline", action="store_true", help="run mimo only")
    ap.add_argument("--out", default=out, help="folder for the table, the JSON lines and the log")
    ap.add_argument("--timeout", type=float, default=timeout, help="seconds allowed to each run")
    ap.add_argument("--fail-fast", action="store_true", help="skip the baselines when every mimo run failed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--options", default="", help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=MetricsConfig.peak_tflops, help="dense bf16 peak, for MFU")
    ap.add_argument("--mimo", action="append", metavar="OVERRIDES",
                    help="dotted overrides of the preset's TOML to run (repeatable); default: the preset as shipped")
    ap.add_argument("--baseline", action="append", metavar="FLAGS",
                    help="baseline switches to run (repeatable); '' = eager; default per preset: "
                         + "; ".join(f"{k}: {v}" for k, v in DEFAULT_BASELINES.items()) + "; others: ['']")
    ap.add_argument("--nproc", action="append", type=int, metavar="N",
                    help="GPUs of each mimo run, data-parallel through torchrun (repeatable, for a scaling table); "
                         "default 1. The baselines always run on one GPU")
    add_driver_args(ap, "runs/bench", 900)
    ap.add_argument("--profile", action="store_true",
                    help="after timing, profile one mimo step and log its most expensive kernels")
    ap.add_argument("--trace-dir", help="where --profile writes Chrome traces (default: OUT/traces)")
    ap.add_argument("--data-parallel", action="store_true", help=argparse.SUPPRESS)
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
