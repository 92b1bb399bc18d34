"""2,000 CPU steps of a tiny demo run (with periodic checkpoints): resident memory may not grow by more
than 5% after step 100. Marked slow; about a minute on two idle cores."""

from __future__ import annotations

import os

import pytest

from mimo.train.trainer import Trainer
from tests.support.tiny_run import tiny_config

STEPS = 2000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_resident_memory_is_flat_over_2000_steps(tmp_path):
    tr = Trainer(tiny_config(tmp_path, f"--train.steps={STEPS}", "--checkpoint.save_every=500", "--train.log_every=100",
                             "--model.llm.hidden=16", "--model.modalities.images.vit.hidden=16",
                             "--data.global_batch=2"))
    samples: dict[int, int] = {}
    real_step = tr.train_step

    def step(s: int) -> dict:
        rec = real_step(s)
        if s >= 100 and s % 100 == 0 or s == STEPS - 1:
            samples[s] = rss_bytes()
        return rec

    tr.train_step = step
    summary = tr.train()
    assert summary["steps"] == STEPS and summary["skipped_steps"] == 0
    base, peak = samples[100], max(samples.values())
    growth = (peak - base) / base
    print(f"RSS at step 100: {base / 2**20:.1f} MiB, peak after: {peak / 2**20:.1f} MiB, growth {growth:.2%}")
    assert growth < 0.05, {k: round(v / 2**20, 1) for k, v in samples.items()}
