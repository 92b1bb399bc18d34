"""`mimo train --nproc N`: N local ranks started, watched and stopped by one launcher process.

The launcher hosts the rendezvous store (no port is guessed) and starts `python -m mimo <argv>` once per rank
with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...). Then:
- SIGTERM and SIGINT are passed on to every rank, which finish the step, save and exit 0; so does the launcher.
- When a rank fails, the others get GRACE_S seconds to end on their own, then are killed, and the message of
  the rank that failed first is printed once: under the launcher a rank writes its error into a file of
  $MIMO_ERROR_DIR instead of printing it. The exit code is that rank's (2: a user error, 3: stopped by
  train.max_bad_steps, 1: anything else; 128 + N: killed by signal N).
- A rank never outlives the launcher: each asks the kernel for SIGTERM when its parent dies
  (PR_SET_PDEATHSIG on Linux, a watchdog thread elsewhere), and SIGTERM makes it save and stop.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ERROR_DIR = "MIMO_ERROR_DIR"
LAUNCHER_PID = "MIMO_LAUNCHER_PID"
GRACE_S = 5.0
"""How long the other ranks may take to end on their own after one failed."""
_PR_SET_PDEATHSIG = 1


def launch_local(nproc: int, argv: list[str]) -> int:
    """Run `python -m mimo <argv>` on `nproc` local ranks; returns the run's exit code (see the module)."""
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    import torch.distributed as dist  # here, so that a rank's die_with_launcher comes before torch loads

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="mimo-ranks-") as errors:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(store.port), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
               "GROUP_RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": "True", ERROR_DIR: errors,
               LAUNCHER_PID: str(os.getpid())}
        ranks = [subprocess.Popen([sys.executable, "-m", "mimo", *argv],
                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(nproc)]

        def forward(signum: int, frame: object) -> None:
            for p in ranks:
                if p.poll() is None:
                    p.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            first = _watch(ranks)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for p in ranks:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return _verdict(ranks, first, Path(errors))


def _watch(ranks: list[subprocess.Popen]) -> int | None:
    """Wait until every rank has ended, killing the rest GRACE_S seconds after the first failure; the rank that
    failed first, or None."""
    first, failed_at = None, 0.0
    while any(p.poll() is None for p in ranks):
        if first is None:
            first = next((r for r, p in enumerate(ranks) if p.poll() not in (None, 0)), None)
            failed_at = time.monotonic()
        elif time.monotonic() - failed_at > GRACE_S:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    if first is None:
        first = next((r for r, p in enumerate(ranks) if p.returncode), None)
    return first


def _verdict(ranks: list[subprocess.Popen], first: int | None, errors: Path) -> int:
    """Print the message of the rank that failed first once (or how it ended); that rank's exit code."""
    if first is None:
        return 0
    code = _exit_code(ranks[first].returncode)
    report = errors / f"rank_{first}"
    text = report.read_text().rstrip() if report.is_file() else f"mimo: error: rank {first} ended with exit code {code}"
    print(f"{text} (rank {first} of {len(ranks)} failed first)" if len(ranks) > 1 else text, file=sys.stderr,
          flush=True)
    return code


def _exit_code(returncode: int) -> int:
    """A shell's exit code for a child's return code (128 + N when signal N killed it)."""
    return 128 - returncode if returncode < 0 else returncode


def under_launcher() -> bool:
    """True in a rank that launch_local started."""
    return ERROR_DIR in os.environ and "RANK" in os.environ


def report_error(text: str) -> None:
    """A rank's final error: to the launcher's error folder under launch_local (which prints one), else stderr."""
    if under_launcher():
        (Path(os.environ[ERROR_DIR]) / f"rank_{os.environ['RANK']}").write_text(text)
    else:
        print(text, file=sys.stderr, flush=True)


def report_crash() -> None:
    """An unexpected exception of a rank: its traceback, reported as `report_error` does."""
    report_error(f"mimo: rank {os.environ.get('RANK', 0)} failed:\n{traceback.format_exc()}")


def die_with_launcher() -> None:
    """In a rank that launch_local started: receive SIGTERM (save and stop) as soon as the launcher dies."""
    launcher = int(os.environ.get(LAUNCHER_PID, "0"))
    if not launcher:
        return
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != launcher:  # it died before the request
            os.kill(os.getpid(), signal.SIGTERM)
        return

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="mimo-launcher-watchdog", daemon=True).start()
