"""Train `small`'s model on samples of LLaVA-1.5's instruction mix with `mimo train`'s Trainer (packing), and
transformers' LLaVA on the same samples (padding to the longest in each batch), in one invocation: useful tokens/s.

    python -m benchmarks.bench_real_shapes --out DIR [--size small|tiny] [--batches 4 --steps 8 --warmup 4]
        [--global-batch 8] [--seed 0] [--timeout 900] [--budget S] [--mimo OVERRIDES]... [--baseline FLAGS]...

On one H200: `python -m benchmarks.bench_real_shapes --out runs/bench_real_shapes --timeout 360 --budget 575` (the
2.2 B-parameter `small`, in one 10-minute call). The default draw (seed 0, 4 batches of 8 samples) holds 6,934
useful tokens a step; padding takes 34.5 % of transformers' rows (each batch padded to its longest sample) and
24.8 % of mimo's packed rows of 2,048 (batches of 16: 40.9 % and 19.2 %); `--mimo data.pack_length=4096` packs
into longer rows.

The data (benchmarks/real_shapes.py, which states its source and which of its numbers are published and which
assumed): `--batches` global batches of `--global-batch` samples drawn with `--seed` from LLaVA-1.5's 665k mix,
zero or one image each, text lengths per source; both sides train on these batches in the same order, cycled
(`--warmup` and `--steps` multiples of `--batches`, so the timed steps cover every batch equally). The mimo side is
`Trainer` on benchmarks/presets/<size>.toml (bench_vlm.build_trainer: off CUDA the CUDA-only keys are turned off)
with data.packing = true (rows of data.pack_length = the preset's seq_len), then `--mimo`'s overrides (`A|B`: B only
if A failed); its data set is the batches above, packed each step by the Trainer's own PackedBatches
(mimo.data.packing) inside the timed step. The baseline (benchmarks/hf_real_shapes_worker.py) is transformers' LLaVA
as benchmarks/baseline/hf_vlm_baseline.py builds it, each batch right-padded to its longest sample with an attention
mask, torch.compile'd (eager if that fails; `--baseline ''` runs it eager). Each step is timed as bench_vlm times
one (synchronise around it).

The figure: useful tokens/s, the tokens of the samples themselves (BOS, image placeholders, text: each carries a
label or feeds one) per second of the mean timed step, with each side's padding share beside it (row tokens that
hold no sample). Both sides count the same useful tokens. Every run is a subprocess of its own (a failure or a
timeout is a table row); the table goes to stdout (last) and DIR/real_shapes_<size>.md, one JSON line per run to
DIR/real_shapes_<size>.jsonl, every run's output to DIR/real_shapes_<size>.log.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from benchmarks import bench_vlm as vlm
from benchmarks.native_workload import CycledBatches
from benchmarks.real_shapes import draw_batches, throughput_row
from benchmarks.workload import load_preset
from mimo.data.packing import PackedBatches
from mimo.data.tokenizer import ByteTokenizer

DEFAULT_MIMO = "|perf.attention_backend=efficient|perf.attention_backend=efficient,perf.compile=false"
"""The preset as shipped with packing; if that fails, memory-efficient attention (which takes any mask); then the LM
left uncompiled too."""
DEFAULT_BASELINES = ["compile|"]
"""transformers' fastest way that runs: torch.compile'd; eager only if that failed."""


def packing_overrides(size: str, global_batch: int) -> str:
    """The preset's keys every mimo run changes: packing into rows of the preset's seq_len, the global batch.
    data.name = 'shapes' only lets the Trainer start (the benchmark replaces its data set)."""
    seq_len = load_preset(size)["seq_len"]
    return ",".join(["data.name=shapes", f"data.train_samples={global_batch}", "data.eval_samples=0",
                     "data.packing=true", f"data.pack_length={seq_len}", f"data.global_batch={global_batch}"])


class MixBatches(CycledBatches):
    """The drawn batches cycled, as a data set of the byte tokenizer (whose pad id PackedBatches packs away)."""

    tok = ByteTokenizer()


def worker(args: argparse.Namespace) -> dict:
    """Train mimo on the drawn batches in this process; its JSON row."""
    spec = ",".join(filter(None, [packing_overrides(args.size, args.global_batch), args.options]))
    trainer = vlm.build_trainer(args.size, spec, Path(args.out) / "runs", args.warmup + args.steps + 1)
    d = trainer.cfg.data
    trainer.data = PackedBatches(MixBatches(draw_batches(args.size, args.batches, args.global_batch, args.seed)),
                                 d.pack_length, trainer.cfg.parallel.microbatches)
    timing = vlm.timed_steps(trainer, args.warmup, args.steps)
    return throughput_row(trainer.data.stats, args.warmup + args.steps, timing, trainer.device, trainer.model,
                          system=vlm.mimo_label(args.options, 1), size=args.size, train=vlm.ran_keys(trainer.cfg))


def common_args(args: argparse.Namespace) -> list[str]:
    return ["--size", args.size, "--out", args.out, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--batches", str(args.batches), "--global-batch", str(args.global_batch), "--seed", str(args.seed)]


def mimo_cmd(args: argparse.Namespace, spec: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.bench_real_shapes", "--worker", *common_args(args), "--options", spec]


def hf_cmd(args: argparse.Namespace, flags: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.hf_real_shapes_worker", *common_args(args), *vlm.switches(flags)]


def table(rows: list[dict]) -> str:
    """Markdown: one row per run, useful tokens/s and the padding share, and the ratio to the fastest baseline."""
    hf = [r for r in rows if "error" not in r and not r["label"].startswith("mimo")]
    best = max((r["useful_tokens_per_s"] for r in hf), default=None)
    head = ["system", "useful tokens/s", "padding share", "useful tokens / step", "step s (mean)", "peak GiB",
            "x fastest baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            cells = [r["label"], r["error"]] + [""] * (len(head) - 2)
        else:
            peak = "" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"
            ratio = "" if best is None else f"{r['useful_tokens_per_s'] / best:.2f}"
            cells = [r["label"], f"{r['useful_tokens_per_s']:,.0f}", f"{100 * r['padding_share']:.1f}%",
                     f"{r['useful_tokens_per_step']:,.0f}", f"{r['step_s_mean']:.4f}", peak, ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(rows: list[dict], baselines: list[dict]) -> str:
    """The headline: the fastest mimo row over the fastest baseline in useful tokens/s (the acceptance figure)."""
    ran, hf = [r for r in rows if "error" not in r], [b for b in baselines if "error" not in b]
    if not ran or not hf:
        return "no ratio: a side has no row"
    best = max(ran, key=lambda r: r["useful_tokens_per_s"])
    fastest = max(hf, key=lambda b: b["useful_tokens_per_s"])
    return (f"{best['label']} / {fastest['label']} (the fastest baseline), useful tokens/s: "
            f"{best['useful_tokens_per_s'] / fastest['useful_tokens_per_s']:.2f}x")


def driver(args: argparse.Namespace, baseline_flags: list[str]) -> None:
    out, name = Path(args.out), f"real_shapes_{args.size}"
    specs = args.mimo if args.mimo is not None else [DEFAULT_MIMO]
    jobs = [([(vlm.mimo_label(a, 1), mimo_cmd(args, a)) for a in s.split("|")], False) for s in specs]
    jobs += [([(vlm.baseline_label(f), hf_cmd(args, f)) for f in s.split("|")], True) for s in baseline_flags]
    rows, baselines = vlm.run_logged(out, name, jobs, args.timeout, args.fail_fast, args.budget)
    text = (f"`{args.size}`'s model on LLaVA-1.5's 665k mix (benchmarks/real_shapes.py): {args.batches} global "
            f"batches of {args.global_batch} samples (seed {args.seed}) cycled, {args.steps} timed steps after "
            f"{args.warmup} warm-up; mimo packs, transformers pads to the longest in each batch\n\n")
    text += table(rows + baselines) + "\n\n" + verdict(rows, baselines)
    (out / f"{name}.md").write_text(text + "\n")
    print(text)


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The switches both sides take: the size, the batches and their timing."""
    ap.add_argument("--size", choices=("small", "tiny"), default="small")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--batches", type=int, default=4, help="distinct global batches, cycled")
    ap.add_argument("--global-batch", type=int, default=8, help="samples per step (small's preset: 8)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the samples' draw")


def check_workload_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.batches < 1 or args.global_batch < 1 or args.steps < 1:
        ap.error("--batches, --global-batch and --steps must be >= 1")
    if args.steps % args.batches or args.warmup % args.batches:
        ap.error(f"--steps ({args.steps}) and --warmup ({args.warmup}) must be multiples of --batches "
                 f"({args.batches}), so that the timed steps cover every batch equally")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(ap)
    ap.add_argument("--mimo", action="append", metavar="OVERRIDES",
                    help=f"dotted overrides of the TOML to run (repeatable; 'A|B': B if A failed); default "
                         f"'{DEFAULT_MIMO}'")
    ap.add_argument("--baseline", action="append", metavar="FLAGS",
                    help="baseline switches (compile), comma-separated (repeatable; 'A|B': B if A failed); '' = eager; "
                         "default 'compile|' (eager only if compiling failed)")
    vlm.add_driver_args(ap, "runs/bench_real_shapes", 900)
    ap.add_argument("--budget", type=float, default=math.inf,
                    help="seconds all the runs together may take (a run is cut where its share would pass it)")
    args = ap.parse_args(argv)
    check_workload_args(ap, args)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    flags = [] if args.no_baseline else args.baseline if args.baseline is not None else DEFAULT_BASELINES
    driver(args, flags)


if __name__ == "__main__":
    main()
