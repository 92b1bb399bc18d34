"""SIGTERM to one rank of two: both stop after the same step, with one checkpoint."""

from __future__ import annotations

import os
import signal
import threading
import time

from tests.support.dist import run_distributed
from tests.support.tiny_run import metrics, pid_files, train_rank


def test_sigterm_to_one_rank_stops_both_after_the_same_step(tmp_path):
    def term_rank1() -> None:
        while len(metrics(tmp_path)) < 4:
            time.sleep(0.005)
        pid = next(int(f.read_text()) for f in pid_files(tmp_path) if f.name == "rank_1")
        os.kill(pid, signal.SIGTERM)

    t = threading.Thread(target=term_rank1, daemon=True)
    t.start()
    results = run_distributed(train_rank, 2, str(tmp_path), ["--train.steps=200"], timeout=240)
    assert results[0] == results[1] and results[0]["stopped"] == "SIGTERM"
    steps = results[0]["steps"]
    assert 4 <= steps < 200
    assert (tmp_path / "tiny" / "checkpoints" / f"step_{steps:08d}" / "COMPLETE.json").is_file()
