"""`mimo train --nproc N`: a layout for another world size is refused before any rank starts, a failing rank's
message is printed once, SIGTERM saves and exits 0, and killing the launcher leaves no rank running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cli_curve import ROOT
from tests.support.tiny_run import DEMO, TINY


def _cmd(out: Path, *overrides: str, config: Path = DEMO) -> list[str]:
    return [sys.executable, "-m", "mimo", "train", str(config), "--nproc=2", *TINY, f"--run.out_dir={out}", *overrides]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_a_layout_for_another_world_size_is_refused_before_launching(tmp_path):
    r = _run(_cmd(tmp_path, config=ROOT / "configs" / "demo_pipeline.toml"))
    assert r.returncode == 2
    assert r.stderr.startswith("mimo: error: grid of 'language' spans ranks 2..7 but the world has 2 ranks")
    assert r.stderr.count("\n") == 1
    assert not (tmp_path / "tiny").exists()


def test_a_failing_rank_is_reported_once_without_tracebacks(tmp_path):
    r = _run(_cmd(tmp_path, f"--checkpoint.resume={tmp_path / 'nowhere'}"))
    assert r.returncode == 2
    assert r.stderr.count("mimo: error:") == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "is not a loadable checkpoint (no such folder)" in r.stderr and "of 2 failed first" in r.stderr


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A long 2-rank run, returned once it has logged three steps."""
    log = (tmp_path / "launcher.log").open("w")
    proc = subprocess.Popen(_cmd(tmp_path, "--train.steps=100000"), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    metrics = tmp_path / "tiny" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()[-3000:]
        time.sleep(0.1)
    return proc, metrics.parent


def _sigterm_checkpoint(run: Path) -> dict:
    (ckpt,) = (run / "checkpoints").iterdir()
    return json.loads((ckpt / "COMPLETE.json").read_text())


def test_sigterm_saves_a_checkpoint_and_exits_0(tmp_path):
    proc, run = _start(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, (tmp_path / "launcher.log").read_text()[-3000:]
    assert _sigterm_checkpoint(run)["reason"] == "sigterm"
    assert "SIGTERM: saved" in (tmp_path / "launcher.log").read_text()


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killing_the_launcher_stops_its_ranks(tmp_path):
    proc, run = _start(tmp_path)
    ranks = _children(proc.pid)
    assert len(ranks) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 120
    while any(_alive(p) for p in ranks):
        assert time.monotonic() < deadline, f"ranks {[p for p in ranks if _alive(p)]} outlived their launcher"
        time.sleep(0.1)
    assert _sigterm_checkpoint(run)["reason"] == "sigterm"
