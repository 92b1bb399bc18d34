"""Test code run by Triton's interpreter on the CPU: in a process of its own, since the interpreter is
chosen when a kernel is defined, i.e. when mimo's kernel modules are imported."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_in_interpreter(code: str) -> None:
    """Run `code` (which prints "ok" last) with TRITON_INTERPRET=1; fail with its error output."""
    pytest.importorskip("triton", reason="Triton is part of the dev extra on Linux")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
