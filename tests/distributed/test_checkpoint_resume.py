"""Kill a 2-process run with SIGKILL at random moments, resume it each time, and get the uninterrupted
run's per-step losses and final weights bit for bit.

One run is killed five times in a chain (each resume is killed again later), at random points past
a step count that grows, so kills land inside steps and inside checkpoint writes alike. A kill in
the middle of a write leaves a staging folder that the next resume reports and ignores.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from mimo.train.checkpoint.weights import load_run
from tests.support.dist import run_distributed
from tests.support.tiny_run import metrics, pid_files, train_rank

STEPS = 30
RUN = [f"--train.steps={STEPS}", "--checkpoint.save_every=2", "--checkpoint.keep=2"]


def _kill_after(out: Path, step_count: int, sig: int, fired: threading.Event) -> threading.Thread:
    """A watcher that sends `sig` to every rank once `step_count` steps are logged, after a random delay."""
    rng = random.Random(step_count)
    path = out / "tiny" / "metrics.jsonl"

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if path.is_file() and path.read_text().count("\n") >= step_count:
                time.sleep(rng.uniform(0.0, 0.03))
                for f in pid_files(out):
                    try:
                        os.kill(int(f.read_text()), sig)
                    except (ProcessLookupError, ValueError):
                        continue
                fired.set()
                return
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_sigkill_and_resume_is_bitwise_identical(tmp_path):
    ref = tmp_path / "ref"
    run_distributed(train_rank, 2, str(ref), RUN, timeout=240)
    expected = [(r["step"], r["loss"]) for r in metrics(ref)]
    assert [s for s, _ in expected] == list(range(STEPS))

    out = tmp_path / "killed"
    resume = [*RUN, "--checkpoint.resume=true"]
    for kill_at in (3, 8, 14, 19, 25):
        fired = threading.Event()
        watcher = _kill_after(out, kill_at, signal.SIGKILL, fired)
        with pytest.raises(RuntimeError, match="exited with code"):
            run_distributed(train_rank, 2, str(out), resume, timeout=240)
        watcher.join(5)
        assert fired.is_set()
        for f in pid_files(out):
            f.unlink()
        assert len(metrics(out)) < STEPS, "the run finished before it was killed"
    run_distributed(train_rank, 2, str(out), resume, timeout=240)

    got = [(r["step"], r["loss"]) for r in metrics(out)]
    assert got == expected
    final, expected_final = load_run(out / "tiny")[1].state_dict(), load_run(ref / "tiny")[1].state_dict()
    assert all(torch.equal(final[k], v) for k, v in expected_final.items())
    kept = sorted(p.name for p in (out / "tiny" / "checkpoints").iterdir())
    assert kept == ["step_00000028", "step_00000030"]
