"""Compare parallel layouts of one image-heavy VLM workload on N GPUs, through mimo's own trainer.

    python -m benchmarks.bench_layouts --nproc 2 --preset small --images 4 [--layout NAME]... [--out DIR]

The workload is a preset of presets.json (its ViT and LM, benchmarks.workload.model_config) with K =
--images images per sample. Each image fills image_tokens(p) placeholders at the start of the sequence
and the text keeps the preset's length, so seq_len = K * image_tokens(p) + (p["seq_len"] - image_tokens(p))
(small, K = 4: 4 * 576 + 1472 = 3776). The data is mimo's `synthetic` set (random text and images, loss
on the text). The global batch (--global-batch; default: the smallest multiple of every layout's
granularity that is >= 2N) is the same for every layout, so each LM data lane takes global / (microbatches
x LM dp) samples per microbatch. Model FLOPs: the step's own count (`mimo.models.flops`, the baseline's
formula, extended to K images); MFU against --peak-tflops per GPU.

Each layout runs in its own `torchrun` (a fresh process group and clean memory; a failed or out-of-memory
run is a table row with its reason) and calls Trainer.train_step, the step of `mimo train`: bf16 autocast
over fp32 master weights and fused AdamW on CUDA, fp32 over gloo on a CPU (for tests). Nothing is saved
but each layout's config.toml (the trainer writes it). A step is timed between two fences (device
synchronise and barrier on every rank); the figure is the median after --warmup steps.

Layout names, for N ranks (SPEC: `dp`, `tp`, `tp2`, `tp2dp4`, `pp2`, ...; a degree without a number,
or a missing dp, takes the ranks left; `sp` adds sequence parallel, `fsdp` sharded data parallel):
  SPEC                         homogeneous: encoder and LM share one layout on all N ranks (e.g. dp8, tp2dp4)
  enc-SPEC_lm-SPEC             colocated heterogeneous: own layouts on the same N ranks (e.g. enc-dp8_lm-tp2dp4)
  pipe-encA[-SPEC]_lmB[-SPEC]  non-colocated: encoder on ranks 0..A-1, LM on the next B (A + B = N),
                               pipelined by 1F1B over --pipe-microbatches (e.g. pipe-enc2_lm6, pipe-enc2_lm6-tp2)
  pipe                         pipe-encA_lmB with A = max(1, N / 4): the LM does most of the work
Without --layout: dpN, tp2(dpN/2), the two mixes of them and pipe (default_layouts). The table goes to stdout
and DIR/<preset>_k<K>_n<N>.md, one JSON line per layout to .jsonl, every run's output to .log. Under
torchrun the script is the worker of one layout and prints its JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks import trace_gaps
from benchmarks.launch import run_row
from benchmarks.workload import (
    MODALITY,
    image_tokens,
    images_seq_len,
    load_preset,
    model_config,
)
from mimo.config.schema import (
    LANGUAGE,
    Config,
    DataConfig,
    MetricsConfig,
    ModuleLayoutConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)
from mimo.config.validate import validate
from mimo.parallel.layout import Layout
from mimo.parallel.layout_rules import batch_multiple
from mimo.parallel.runtime import torchrun_cmd
from mimo.planner.candidates import label
from mimo.train.gate import check_layout
from mimo.train.trainer import Trainer

HOMOGENEOUS, COLOCATED, PIPELINED = "homogeneous", "colocated", "pipelined"
_SPEC = re.compile(r"(?:(?:tp|pp|dp)\d*|sp|fsdp)+")
_TOKEN = re.compile(r"(tp|pp|dp)(\d*)|sp|fsdp")
_COLOCATED = re.compile(r"enc-([a-z0-9]+)_lm-([a-z0-9]+)")
_PIPELINED = re.compile(r"pipe-enc(\d+)(?:-([a-z0-9]+))?_lm(\d+)(?:-([a-z0-9]+))?")


@dataclass(frozen=True)
class BenchLayout:
    """A --layout name resolved for a world size: the ParallelConfig it stands for."""

    name: str
    parallel: ParallelConfig

    @property
    def kind(self) -> str:
        enc, lm = self.parallel.modules[MODALITY], self.parallel.modules[LANGUAGE]
        if (enc.offset, enc.size) != (lm.offset, lm.size):
            return PIPELINED
        return HOMOGENEOUS if enc == lm else COLOCATED

    def grids(self, world: int) -> Layout:
        return Layout.from_config(self.parallel.modules, [LANGUAGE, MODALITY], world)

    def granularity(self, world: int) -> int:
        """The global batch must be a multiple of this."""
        return batch_multiple(self.grids(world), self.parallel.microbatches)

    def describe(self, world: int) -> str:
        """The per-module layouts in `mimo plan`'s words, for the table."""
        text = label(self.grids(world), self.parallel.modules)
        if self.kind == PIPELINED:
            return f"{text}, 1F1B over {self.parallel.microbatches} microbatches"
        accumulation = f", {self.parallel.microbatches} microbatches" if self.parallel.microbatches > 1 else ""
        return f"{text}, " + (f"all {world} ranks" if world > 1 else "one rank") + accumulation


def module_layout(spec: str, offset: int, size: int, layout: str) -> ModuleLayoutConfig:
    """One module's grid on `size` ranks from `offset`, from a SPEC such as dp, tp2, tp2dp4, pp2, tp2sp."""
    if not _SPEC.fullmatch(spec):
        raise ValueError(f"--layout {layout}: '{spec}' is not a module layout; write degrees such as dp, tp, tp2, "
                         "tp2dp4 or pp2, optionally with sp (sequence parallel) or fsdp")
    tokens = list(_TOKEN.finditer(spec))
    degrees = [(m[1], m[2]) for m in tokens if m[1]]
    flags = [m[0] for m in tokens if not m[1]]
    names = [d for d, _ in degrees] + flags
    if len(set(names)) < len(names):
        raise ValueError(f"--layout {layout}: '{spec}' names a degree or a flag twice")
    given = {d: int(n) for d, n in degrees if n}
    rest = [d for d, n in degrees if not n] or ([] if "dp" in given else ["dp"])
    if len(rest) > 1 or 0 in given.values():
        raise ValueError(f"--layout {layout}: in '{spec}' at most one degree may take the ranks left (no number), "
                         "and every number must be >= 1")
    product = math.prod(given.values())
    if rest and size % product == 0:
        given[rest[0]] = size // product
    if math.prod(given.values()) != size:
        raise ValueError(f"--layout {layout}: '{spec}' does not fill its {size} ranks (tp x pp x dp must be {size})")
    return ModuleLayoutConfig(offset=offset, size=size, tp=given.get("tp", 1), pp=given.get("pp", 1),
                              sequence_parallel="sp" in flags, fsdp="fsdp" in flags)


def parse_layout(name: str, world: int, microbatches: int = 1, pipe_microbatches: int = 4) -> BenchLayout:
    """A --layout name (see the module docstring) as the ParallelConfig it stands for on `world` ranks."""
    if name == "pipe":
        if world < 2:
            raise ValueError("--layout pipe puts the encoder and the LM on disjoint ranks: it needs --nproc >= 2")
        enc = max(1, world // 4)
        return replace(parse_layout(f"pipe-enc{enc}_lm{world - enc}", world, microbatches,
                                     pipe_microbatches), name=name)
    if m := _PIPELINED.fullmatch(name):
        a, b = int(m[1]), int(m[3])
        if a < 1 or b < 1 or a + b != world:
            raise ValueError(f"--layout {name}: the encoder's {a} and the LM's {b} ranks must both be >= 1 and add "
                             f"up to the {world} ranks of --nproc")
        modules = {MODALITY: module_layout(m[2] or "dp", 0, a, name), LANGUAGE: module_layout(m[4] or "dp", a, b, name)}
        return BenchLayout(name, ParallelConfig(modules=modules, microbatches=pipe_microbatches))
    if m := _COLOCATED.fullmatch(name):
        modules = {MODALITY: module_layout(m[1], 0, world, name), LANGUAGE: module_layout(m[2], 0, world, name)}
        return BenchLayout(name, ParallelConfig(modules=modules, microbatches=microbatches))
    if _SPEC.fullmatch(name):
        grid = module_layout(name, 0, world, name)
        return BenchLayout(name, ParallelConfig(modules={MODALITY: grid, LANGUAGE: grid}, microbatches=microbatches))
    raise ValueError(f"--layout {name}: not a layout name; use SPEC (e.g. dp, tp2), enc-SPEC_lm-SPEC (e.g. "
                     "enc-dp_lm-tp2), pipe-encA_lmB (e.g. pipe-enc1_lm3) or pipe")


def default_layouts(world: int) -> list[str]:
    """Candidates of each kind on `world` ranks. TP stops at 2 because the presets' LMs have 2 KV heads."""
    if world == 1:
        return ["dp1"]
    half = "tp2" if world == 2 else f"tp2dp{world // 2}"
    return [f"dp{world}", half, f"enc-dp{world}_lm-{half}", f"enc-{half}_lm-dp{world}", "pipe"]


def default_global_batch(layouts: list[BenchLayout], world: int) -> int:
    """The smallest batch that every layout can split and that gives each GPU at least two samples."""
    unit = math.lcm(*(layout.granularity(world) for layout in layouts))
    return unit * -(-2 * world // unit)


def bench_config(args: argparse.Namespace, layout: BenchLayout, global_batch: int) -> Config:
    """The whole run's config: the preset with K images, synthetic data, this layout, no outputs but config.toml."""
    p = load_preset(args.preset)
    seq = images_seq_len(p, args.images)
    cuda = torch.cuda.is_available()
    cfg = Config(run=RunConfig(name=layout.name, out_dir=str(Path(args.out) / run_stem(args)), overwrite=True),
                 model=model_config({**p, "seq_len": seq}),
                 parallel=layout.parallel,
                 data=DataConfig(name="synthetic", global_batch=global_batch, seq_len=seq,
                                 images_per_sample=args.images),
                 optim=OptimConfig(lr=1e-5, warmup_steps=0, schedule="constant"),
                 train=TrainConfig(steps=args.warmup + args.steps, device="cuda" if cuda else "cpu"),
                 precision=PrecisionConfig(dtype="bfloat16" if cuda else "float32"),
                 metrics=MetricsConfig(tensorboard=False, progress=False))
    validate(cfg)
    return cfg


def run_stem(args: argparse.Namespace) -> str:
    return f"{args.preset}_k{args.images}_n{args.nproc}"


def fence(device: torch.device) -> None:
    """Return when every rank's queued work is done: synchronise, barrier (maybe a GPU kernel), synchronise."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.is_initialized():
        dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """The largest peak of allocated device memory over the ranks (None on a CPU)."""
    if device.type != "cuda":
        return None
    peak = torch.tensor([float(torch.cuda.max_memory_allocated(device))], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return round(peak.item() / 2**30, 2)


def worker(args: argparse.Namespace) -> dict | None:
    """One layout on this torchrun's ranks; the result row on rank 0, None elsewhere."""
    world = args.nproc = int(os.environ.get("WORLD_SIZE", "1"))
    layout = parse_layout(args.layout[0], world, args.microbatches, args.pipe_microbatches)
    global_batch = args.global_batch or default_global_batch([layout], world)
    cfg = bench_config(args, layout, global_batch)
    with Trainer(cfg) as trainer:  # leaves the process group at the end of the block
        trainer.write_run_config(start=0)
        times, rec = [], {}
        for step in range(args.warmup + args.steps):
            fence(trainer.device)
            t0 = time.perf_counter()
            rec = trainer.train_step(step)
            fence(trainer.device)
            times.append(time.perf_counter() - t0)
        if not (math.isfinite(rec["loss"]) and rec["stepped"]):
            raise RuntimeError(f"step {rec['step']} was not a clean step: loss {rec['loss']}, stepped {rec['stepped']}")
        split = profile_step(trainer, args.warmup + args.steps) if args.profile else None
        peak = peak_memory_gib(trainer.device)
    if trainer.rank != 0:
        return None
    step_s = statistics.median(times[args.warmup:])
    tokens_per_s = global_batch * cfg.data.seq_len / step_s
    tflops = rec["flops"] / step_s / world / 1e12
    return {"layout": layout.name, "kind": layout.kind, "modules": layout.describe(world), "preset": args.preset,
            "images": args.images, "seq_len": cfg.data.seq_len, "world_size": world, "global_batch": global_batch,
            "microbatches": cfg.parallel.microbatches,
            "device": torch.cuda.get_device_name() if trainer.device.type == "cuda" else "cpu",
            "dtype": cfg.precision.dtype, "torch": torch.__version__, "step_s_median": round(step_s, 5),
            "first_step_s": round(times[0], 2), "tokens_per_s": round(tokens_per_s, 1),
            "tokens_per_s_per_gpu": round(tokens_per_s / world, 1), "model_tflops_per_gpu": float(f"{tflops:.4g}"),
            "mfu": float(f"{tflops / args.peak_tflops:.4g}"), "peak_mem_gib": peak, "final_loss": round(rec["loss"], 4),
            **({"profile": split} if split is not None else {})}


def profile_step(trainer: Trainer, step: int) -> list[dict[str, float]]:
    """One more step under the profiler on every rank: how each GPU spent it (compute, communication not
    hidden behind compute or waiting for a peer, idle; trace_gaps.compute_and_communication), in rank order."""
    fence(trainer.device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        trainer.train_step(step)
        torch.cuda.synchronize(trainer.device)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = trace_gaps.device_events(json.loads(trace.read_text()))
    split = {k: round(v, 2) for k, v in trace_gaps.compute_and_communication(events).items()}
    if not dist.is_initialized():
        return [split]
    splits: list = [None] * dist.get_world_size()
    dist.all_gather_object(splits, split)
    return splits


def worker_cmd(args: argparse.Namespace, name: str, global_batch: int) -> list[str]:
    return [*torchrun_cmd(args.nproc), "-m", "benchmarks.bench_layouts", "--layout", name, "--preset", args.preset,
            "--images", str(args.images),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--global-batch", str(global_batch),
            "--microbatches", str(args.microbatches), "--pipe-microbatches", str(args.pipe_microbatches),
            "--out", args.out, "--peak-tflops", str(args.peak_tflops), *(["--profile"] if args.profile else [])]


def table(rows: list[dict]) -> str:
    """Markdown: one row per layout, throughput relative to the best homogeneous layout that ran."""
    homogeneous = [r["tokens_per_s"] for r in rows if r.get("kind") == HOMOGENEOUS and "error" not in r]
    best = max(homogeneous, default=None)
    head = ["layout", "kind", "modules", "tokens/s", "tokens/s/GPU", "TFLOP/s/GPU", "MFU", "peak GiB",
            "x best homogeneous"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            cells = [r["layout"], r.get("kind", ""), r.get("modules", ""), r["error"]] + [""] * (len(head) - 4)
        else:
            peak = "-" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"
            ratio = "" if best is None else f"{r['tokens_per_s'] / best:.2f}"
            cells = [r["layout"], r["kind"], r["modules"], f"{r['tokens_per_s']:,.0f}",
                     f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['model_tflops_per_gpu']:.1f}", f"{100 * r['mfu']:.1f}%",
                     peak, ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile_table(rows: list[dict]) -> str:
    """Markdown: each profiled GPU's step split into compute, exposed communication (with waits) and idle."""
    lines = ["| layout | rank | step ms | compute ms | communication + waits ms (not hidden) | idle ms |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        for rank, split in enumerate(r.get("profile", [])):
            lines.append(f"| {r['layout']} | {rank} | {split['span']:.1f} | {split['compute']:.1f} | "
                         f"{split['exposed_comm']:.1f} | {split['idle']:.1f} |")
    return "\n".join(lines)


def plan_runs(args: argparse.Namespace) -> tuple[list[BenchLayout], int]:
    """Every layout resolved and checked against the model and the global batch before any run starts
    (pure: a typo or an impossible layout costs no GPU time). Raises ValueError naming the layout."""
    layouts = [parse_layout(n, args.nproc, args.microbatches, args.pipe_microbatches)
               for n in args.layout or default_layouts(args.nproc)]
    global_batch = args.global_batch or default_global_batch(layouts, args.nproc)
    problems = []
    for layout in layouts:
        unit = layout.granularity(args.nproc)
        if global_batch % unit:
            problems.append(f"--layout {layout.name}: --global-batch {global_batch} must be a multiple of {unit} "
                            f"(microbatches x each module's dp); use a multiple of {unit}")
            continue
        try:
            cfg, grids = bench_config(args, layout, global_batch), layout.grids(args.nproc)
            check_layout(cfg, grids)
        except ValueError as e:
            problems.append(f"--layout {layout.name}: {e}")
    if problems:
        raise ValueError("\n".join(problems))
    return layouts, global_batch


def driver(args: argparse.Namespace, layouts: list[BenchLayout], global_batch: int) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = run_stem(args)
    log, jsonl = out / f"{stem}.log", out / f"{stem}.jsonl"
    log.write_text("")
    jsonl.write_text("")
    # torchrun gives each rank one thread unless told; the model's init on the host wants more.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
    rows = []
    for layout in layouts:
        print(f"running {layout.name}: {layout.describe(args.nproc)} ...", flush=True)
        cmd = worker_cmd(args, layout.name, global_batch)
        r = {"kind": layout.kind, "modules": layout.describe(args.nproc), "layout": layout.name,
             **run_row(cmd, layout.name, log, args.timeout)}
        print(json.dumps(r), flush=True)
        with jsonl.open("a") as f:
            f.write(json.dumps(r) + "\n")
        rows.append(r)
    p = load_preset(args.preset)
    n = image_tokens(p)
    device = next((r["device"] for r in rows if "device" in r), "?")
    text = (f"preset `{args.preset}`, {args.images} images per sample: {images_seq_len(p, args.images)} tokens "
            f"({args.images} x {n} image + {p['seq_len'] - n} text), global batch {global_batch} samples, "
            f"{args.nproc} x {device}; median of {args.steps} steps after {args.warmup} warm-up, MFU against "
            f"{args.peak_tflops:g} TFLOP/s per GPU\n\n{table(rows)}")
    if any("profile" in r for r in rows):
        text += f"\n\nOne profiled step per layout, each GPU's device time:\n\n{profile_table(rows)}"
    (out / f"{stem}.md").write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=torch.cuda.device_count() or 2,
                    help="GPUs (processes) per layout; default: every visible GPU, 2 on a CPU")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--images", type=int, default=4, help="images per sample (K)")
    ap.add_argument("--layout", action="append", metavar="NAME", help="layout to run (repeatable); default: "
                    "default_layouts(N), e.g. for N=8: " + ", ".join(default_layouts(8)))
    ap.add_argument("--steps", type=int, default=10, help="timed steps per layout")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="samples per step, the same for every layout; default: the smallest multiple of every "
                         "layout's microbatches x dp that is >= 2N")
    ap.add_argument("--microbatches", type=int, default=1,
                    help="gradient-accumulation microbatches of colocated layouts")
    ap.add_argument("--pipe-microbatches", type=int, default=4, help="1F1B microbatches of pipelined layouts")
    ap.add_argument("--peak-tflops", type=float, default=MetricsConfig.peak_tflops,
                    help="dense bf16 peak per GPU, for MFU")
    ap.add_argument("--out", default="runs/bench_layouts", help="folder for the table, the JSON lines and the log")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed to each layout's run")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, profile one step and split each GPU's time into compute, communication "
                         "not hidden behind compute (waits for a peer included) and idle (CUDA only)")
    args = ap.parse_args(argv)
    if args.profile and not torch.cuda.is_available():
        ap.error("--profile splits the GPUs' kernel timelines and needs CUDA; drop --profile on a CPU")
    for flag in ("nproc", "images", "steps", "microbatches", "pipe_microbatches"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.global_batch < 0:
        ap.error("--warmup and --global-batch must be >= 0 (--global-batch 0: the default)")
    if "LOCAL_RANK" in os.environ:
        if len(args.layout or []) != 1:
            ap.error("under torchrun give exactly one --layout; to compare layouts run without torchrun: "
                     "python -m benchmarks.bench_layouts --nproc N ...")
        row = worker(args)
        if row is not None:
            print(json.dumps(row), flush=True)
        return
    try:
        layouts, global_batch = plan_runs(args)
    except ValueError as e:
        ap.error(str(e))
    driver(args, layouts, global_batch)


if __name__ == "__main__":
    main()
