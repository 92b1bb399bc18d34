"""`mimo train` run through the CLI on N processes and read back as its per-step loss curve (the layout
tests on gloo, test_parallel_cli, and on GPUs, test_multi_gpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["--train.steps=20", "--train.log_every=1", "--metrics.progress=false", "--metrics.tensorboard=false",
         "--data.train_samples=640", "--data.eval_samples=12"]


def loss_curve(out: Path, name: str, config: str, nproc: int, *overrides: str, timeout: float = 900) -> list[float]:
    """The loss of each of 20 steps of `configs/<config>` on `nproc` processes, written under `out/name`."""
    cmd = [sys.executable, "-m", "mimo", "train", str(ROOT / "configs" / config), f"--nproc={nproc}",
           f"--run.out_dir={out}", f"--run.name={name}", *STEPS, *overrides]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, failure_output(r.stderr)
    return [json.loads(line)["loss"] for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def failure_output(stderr: str) -> str:
    """What a failed torchrun printed before torchrun reacted, then its verdict naming the first rank to fail.

    torchrun's own report (signals sent to the other ranks, one block per rank) is long enough to push
    the failing rank's message out of a plain tail.
    """
    cut = stderr.find("elastic/multiprocessing/api.py")
    if cut < 0:
        return stderr[-4000:]
    verdict = stderr.rfind("Root Cause")
    return stderr[:cut][-4000:] + "\n[... torchrun's report ...]\n" + (stderr[verdict:] if verdict >= 0 else "")
