"""`mimo plan`'s predicted step time against the measured one, on this machine's device, one GPU.

    python -m benchmarks.bench_planner --profile P.json --config benchmarks/presets/small.toml [--steps 12]

Builds `mimo train`'s Trainer from each config (its own overrides after `::`, e.g.
`benchmarks/planner/avlm_h200.toml::train.steps=40`), times `Trainer.train_step` as benchmarks/bench_vlm.py
does (synchronised around each step, the median after --warmup steps; no checkpoint is written), and prints
one JSON line per config: measured and predicted step seconds, their ratio, and the prediction's parts.
Each config runs in its own process (clean device memory) unless --inline, for at most --timeout seconds (a
config past it is killed and gives an error row). Progress goes to stderr as it happens (which config runs, its
Trainer's build time, each step's time), so a run cut off from outside still shows where it stopped.

`python -m benchmarks.bench_planner --profile P.json --third-session` predicts, with no device, the five 2-GPU
layouts the third session measured (BENCHMARKS.md: `small` with 4 images a sample, eager `mimo train` step) and
prints them beside those measurements.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.bench_vlm import time_steps
from mimo.config.load import load_config
from mimo.config.schema import ModuleLayoutConfig
from mimo.planner.candidates import cost_at, label, make_plan
from mimo.planner.memory import module_sizes
from mimo.planner.network import Network
from mimo.planner.predict import Setting
from mimo.planner.profile import load_profile
from mimo.train.trainer import Trainer


def split_config(spec: str) -> tuple[str, list[str]]:
    """'path::a=1,b=2' -> ('path', ['--a=1', '--b=2'])."""
    path, _, rest = spec.partition("::")
    return path, [f"--{item.strip()}" for item in rest.split(",") if item.strip()]


def predicted(spec: str, profile: Path) -> dict:
    """The one-GPU prediction of `spec`'s config (the planner's only candidate on one GPU)."""
    path, overrides = split_config(spec)
    cfg = load_config(path, overrides)
    row = make_plan(cfg, 1, 1e6, load_profile(profile)).rows[0]
    p = row.prediction
    return {"predicted_step_s": p.step_s, "compute_s": p.compute_s, "comm_s": p.comm_s,
            "optimizer_s": p.optimizer_s, "predicted_mfu": p.mfu, "estimated_peak_gib": row.peak_gib}


def note(line: str) -> None:
    """One progress line on stderr, at once."""
    print(f"bench_planner: {line}", file=sys.stderr, flush=True)


def noted_step(trainer: Trainer, spec: str) -> Callable[[int], float]:
    """`trainer`'s step i for `time_steps`, saying on stderr how long it took (synchronised on CUDA, as
    time_steps synchronises after it anyway)."""
    cuda = trainer.device.type == "cuda"

    def step(i: int) -> float:
        began = time.perf_counter()
        loss = trainer.train_step(i)["loss"]
        if cuda:
            torch.cuda.synchronize()
        note(f"{spec}: step {i} took {time.perf_counter() - began:.2f} s")
        return loss
    return step


def measured(spec: str, warmup: int, steps: int) -> dict:
    """Median seconds of `steps` Trainer.train_step calls after `warmup`, on the config's device."""
    path, overrides = split_config(spec)
    with tempfile.TemporaryDirectory() as out:
        began = time.perf_counter()
        cfg = load_config(path, [*overrides, f"--train.steps={warmup + steps}", f"--run.out_dir={out}"])
        trainer = Trainer(cfg)
        note(f"{spec}: config loaded and Trainer built in {time.perf_counter() - began:.1f} s")
        rec = time_steps(noted_step(trainer, spec), trainer.device.type == "cuda", warmup, steps)
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    return {"step_s": rec["step_s_median"], "first_step_s": rec["first_step_s"], "peak_gib": peak}


def run_child(cmd: list[str], timeout: float | None) -> tuple[int | None, str, str]:
    """Run `cmd` in a session of its own, its stderr echoed to ours line by line as it comes: (exit status,
    or None where it ran past `timeout` seconds and its process group was killed; its stdout; its stderr's
    last 2,000 characters)."""
    tail: collections.deque[str] = collections.deque(maxlen=200)
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, start_new_session=True)

        def echo() -> None:
            for line in child.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                tail.append(line)
        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        try:
            code: int | None = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = None
        reader.join(timeout=5)
        out.seek(0)
        return code, out.read(), "".join(tail)[-2000:]


def measured_apart(spec: str, args: argparse.Namespace) -> dict:
    """`measured` in a process of its own (clean device memory), under args.timeout: its row, or an error row."""
    cmd = [sys.executable, "-m", "benchmarks.bench_planner", "--profile", str(args.profile), "--config", spec,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--inline"]
    began = time.perf_counter()
    code, stdout, stderr = run_child(cmd, args.timeout)
    if code is None:
        return {"error": f"timed out after {args.timeout:g} s (--timeout); its stderr's end: {stderr}"}
    if code:
        return {"error": stderr}
    note(f"{spec}: measured in {time.perf_counter() - began:.1f} s")
    return json.loads(stdout.strip().splitlines()[-1])


THIRD_SESSION = ["--data.images_per_sample=4", "--data.global_batch=8", "--data.seq_len=3776",
                 "--model.llm.max_seq=4096",
                 "--precision.master_weights=false",
                 *(f"--perf.{k}=false" for k in ("grad_table", "compile", "chunked_loss", "loss_rows_only",
                                                 "fuse_qkv"))]
"""`small` as the third session's bench_layouts ran it: 4 x 576 image + 1472 text tokens, bf16 autocast, eager."""
THIRD_SESSION_LAYOUTS = {  # name: (images, language, microbatches, measured tokens/s on 2 H200s)
    "dp2": (ModuleLayoutConfig(), ModuleLayoutConfig(), 2, 41532),
    "tp2": (ModuleLayoutConfig(tp=2), ModuleLayoutConfig(tp=2), 2, 33918),
    "enc-dp2_lm-tp2": (ModuleLayoutConfig(), ModuleLayoutConfig(tp=2), 2, 34632),
    "enc-tp2_lm-dp2": (ModuleLayoutConfig(tp=2), ModuleLayoutConfig(), 2, 38291),
    "pipe": (ModuleLayoutConfig(offset=0, size=1), ModuleLayoutConfig(offset=1, size=1), 8, 25057)}


def third_session(profile: Path) -> None:
    """The third session's 2-GPU layouts: measured step (from its tokens/s) against the prediction."""
    cfg = load_config("benchmarks/presets/small.toml", THIRD_SESSION)
    setting = Setting(cfg, module_sizes(cfg), load_profile(profile), Network())
    for name, (images, language, micro, tokens_per_s) in THIRD_SESSION_LAYOUTS.items():
        row = cost_at(setting, {"images": images, "language": language}, micro, 2, 1e6)
        measured = cfg.data.global_batch * cfg.data.seq_len / tokens_per_s
        p = row.prediction
        print(json.dumps({"layout": name, "label": label(row.layout, row.modules), "microbatches": micro,
                          "measured_step_s": measured, "predicted_step_s": p.step_s,
                          "predicted_over_measured": p.step_s / measured, "compute_s": p.compute_s,
                          "comm_s": p.comm_s, "reduce_s": p.reduce_s, "bubble_s": p.bubble_s}))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, type=Path)
    ap.add_argument("--config", action="append", default=[], help="a config, overrides after '::'")
    ap.add_argument("--third-session", action="store_true", help="predict the third session's 2-GPU layouts")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--inline", action="store_true", help="measure in this process")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds one config's process may run (build, compile and steps) before it is killed "
                         "and gives an error row; default: no limit")
    args = ap.parse_args(argv)
    if args.third_session:
        third_session(args.profile)
    for k, spec in enumerate(args.config):
        if args.inline:
            print(json.dumps({"config": spec, **measured(spec, args.warmup, args.steps)}), flush=True)
            continue
        note(f"config {k + 1} of {len(args.config)}: {spec}")
        row = measured_apart(spec, args)
        if "error" not in row:
            row = {**row, **predicted(spec, args.profile)}
            row["predicted_over_measured"] = row["predicted_step_s"] / row["step_s"]
        print(json.dumps({"config": spec, **row}), flush=True)

if __name__ == "__main__":
    main()
