"""One benchmark run in a subprocess (often a torchrun): its result row, or why there is none.

Shared by bench_vlm and bench_layouts, which run every system or layout in a process of its own so that
peak memory is clean and an out-of-memory run becomes a table row instead of a crash.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 60
"""How long a run out of time gets to stop (torchrun stopping its ranks) before it is killed."""
_ERROR_LINE = re.compile(r"[\w.]*(Error|Exception): ")


def failure(text: str, rc: int | None) -> str:
    """Why a run gave no row, in one line: the last exception a rank raised (not torchrun's summary of it)."""
    if rc is None:
        return "timed out"
    if "out of memory" in text.lower() or "OutOfMemoryError" in text:
        return "out of memory"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line) and "ChildFailedError" not in line]
    return f"failed (rc={rc}): " + ((errors or lines or ["no output"])[-1])[:200]


def _stop(proc: subprocess.Popen) -> str:
    """Stop a run and return what it printed. torchrun starts each rank in a session of its own, so a
    killed torchrun would leave them holding their GPUs; on SIGTERM it stops them itself. Its output is
    read only while it lives, since ranks left behind would hold the pipe open."""
    proc.terminate()
    try:
        return proc.communicate(timeout=STOP_GRACE_S)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        return f"the run did not stop within {STOP_GRACE_S} s of SIGTERM and was killed; its ranks may be left"


def run_row(cmd: list[str], label: str, log: Path, timeout: float) -> dict:
    """Run `cmd` from the repository root (on PYTHONPATH); its last JSON line, or {"error": why}. The whole
    output is appended to `log`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        try:
            text, rc = proc.communicate(timeout=timeout)[0], proc.returncode
        except BaseException as e:  # the timeout, or Ctrl-C
            text, rc = _stop(proc) + f"\ntimed out after {timeout:.0f} s", None
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
    with log.open("a") as f:
        f.write(f"\n===== {label}: {' '.join(cmd)} (rc={rc})\n{text}\n")
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{") and line.endswith("}")]
    if rc == 0 and rows:
        return rows[-1]
    return {"error": failure(text, rc)}
