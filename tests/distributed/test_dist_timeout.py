"""parallel.timeout_s bounds every collective: a rank whose peer never joins a collective fails after about
that long instead of waiting forever (torch's default would be 30 minutes), on the default group and on
the groups the grid makes; `collective_failed` knows the error for what it is (`mimo train` reports it as a
failed collective; other errors: tests/unit/test_collective_failed.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from tests.support.cli_curve import ROOT

SCRIPT = """
import sys, time
import torch, torch.distributed as dist
from mimo.parallel.grid import member_group
from mimo.parallel.runtime import collective_failed, init_distributed

rank, world = init_distributed("cpu", float(sys.argv[1]))
group, _ = member_group([[0, 1]])
if rank == 1:
    time.sleep(120)
for name, g in (("world", None), ("grid", group)):
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=g)
    except Exception as e:
        print(f"{name} failed after {time.monotonic() - t0:.1f} s: {type(e).__name__} {collective_failed(e)}",
              flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_collective_without_its_peer_fails_after_parallel_timeout_s(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text(SCRIPT)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}  # this tree's mimo, not the installed one
    procs = [subprocess.Popen([sys.executable, str(script), "3"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "PATH": ""}) for r in range(2)]
    try:
        t0 = time.monotonic()
        out, _ = procs[0].communicate(timeout=90)
        elapsed = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["world", "grid"], out
    for line in lines:
        waited = float(line.split()[3])
        assert 2.5 <= waited < 15, line
        assert line.split()[-1] == "True", line
    assert elapsed < 60
