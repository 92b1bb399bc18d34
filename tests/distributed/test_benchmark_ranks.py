"""benchmarks/bench_vlm.py on 2 gloo ranks through torchrun: one row, whose throughput counts both ranks."""

import json
import math
import os
import subprocess
import sys

from tests.support.cli_curve import ROOT


def test_benchmark_runs_data_parallel_on_tiny(tmp_path):
    """mimo on 2 gloo ranks through torchrun: one row, whose throughput is over both ranks; the one-process keys
    are off, precision.master_weights on (its fp32 state sharded over the two ranks)."""
    cmd = [sys.executable, "-m", "benchmarks.bench_vlm", "--preset", "tiny", "--nproc", "2", "--no-baseline",
           "--steps", "2", "--warmup", "1", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    [row] = map(json.loads, (tmp_path / "tiny.jsonl").read_text().splitlines())
    assert row["label"] == "mimo on 2 GPUs" and row["gpus"] == 2, row
    assert row["train"]["master_weights"] and not row["train"]["grad_table"], row["train"]
    assert row["tokens_per_s_per_gpu"] > 0 and math.isfinite(row["final_loss"]), row
    assert "| mimo on 2 GPUs | 2 |" in (tmp_path / "tiny.md").read_text()
