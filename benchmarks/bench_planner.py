"""`mimo plan`'s predicted step time against the measured one, on this machine's device, one GPU.

    python -m benchmarks.bench_planner --profile P.json --config benchmarks/presets/small.toml [--steps 12]

Builds `mimo train`'s Trainer from each config (its own overrides after `::`, e.g.
`benchmarks/planner/avlm_h200.toml::train.steps=40`), times `Trainer.train_step` as benchmarks/bench_vlm.py
does (synchronised around each step, the median after --warmup steps; no checkpoint is written), and prints
one JSON line per config: measured and predicted step seconds, their ratio, and the prediction's parts.
Each config runs in its own process (clean device memory) unless --inline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.bench_vlm import timed_steps
from mimo.config.load import load_config
from mimo.planner.candidates import make_plan
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


def measured(spec: str, warmup: int, steps: int) -> dict:
    """Median seconds of `steps` Trainer.train_step calls after `warmup`, on the config's device."""
    path, overrides = split_config(spec)
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(path, [*overrides, f"--train.steps={warmup + steps}", f"--run.out_dir={out}"])
        trainer = Trainer(cfg)
        rec = timed_steps(trainer, warmup, steps)
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    return {"step_s": rec["step_s_median"], "first_step_s": rec["first_step_s"], "peak_gib": peak}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, type=Path)
    ap.add_argument("--config", action="append", required=True, help="a config, overrides after '::'")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--inline", action="store_true", help="measure in this process")
    args = ap.parse_args(argv)
    for spec in args.config:
        if args.inline:
            row = measured(spec, args.warmup, args.steps)
        else:
            cmd = [sys.executable, "-m", "benchmarks.bench_planner", "--profile", str(args.profile), "--config", spec,
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--inline"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                print(json.dumps({"config": spec, "error": done.stderr[-2000:]}), flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
        if not args.inline:
            row = {**row, **predicted(spec, args.profile)}
            row["predicted_over_measured"] = row["predicted_step_s"] / row["step_s"]
        print(json.dumps({"config": spec, **row}), flush=True)


if __name__ == "__main__":
    main()
