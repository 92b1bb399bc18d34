"""benchmarks/bench_layouts.py as a program: three layouts on two CPU processes; --profile refused without CUDA."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_driver_runs_three_layouts_on_two_cpu_processes(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.bench_layouts", "--nproc", "2", "--preset", "tiny", "--images", "2",
           "--layout", "dp", "--layout", "enc-dp_lm-tp", "--layout", "pipe", "--steps", "2", "--warmup", "1",
           "--out", str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "tiny_k2_n2.jsonl").read_text().splitlines()]
    assert [row["layout"] for row in rows] == ["dp", "enc-dp_lm-tp", "pipe"]
    for row in rows:
        assert "error" not in row, row
        for key in ("step_s_median", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        assert row["seq_len"] == 2 * 16 + 48 and row["global_batch"] == 4
        # same data and model on every layout (a smoke check only: random text keeps the loss near ln(vocab),
        # so layout bugs are the parity suites' job, tests/distributed/test_colocated.py and
        # tests/distributed/test_pipeline.py)
        assert row["final_loss"] == pytest.approx(rows[0]["final_loss"], rel=1e-3)
    assert (tmp_path / "tiny_k2_n2" / "pipe" / "config.toml").is_file()
    assert "| enc-dp_lm-tp | colocated |" in (tmp_path / "tiny_k2_n2.md").read_text()


def test_profile_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --profile is allowed here")
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench_layouts", "--profile", "--preset", "tiny"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--profile splits the GPUs' kernel timelines and needs CUDA" in r.stderr
