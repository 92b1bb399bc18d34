"""Under `mimo train --nproc 2` only rank 0 talks to Weights & Biases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.cli_curve import ROOT
from tests.support.tiny_run import DEMO, TINY


def test_only_rank_0_of_a_two_rank_run_talks_to_wandb(tmp_path):
    """Under `mimo train --nproc 2` (plain data parallel) one W&B run is made, from rank 0, with every step."""
    fake = tmp_path / "fake" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import json, os\n"
        "def _write(kind, **kw):\n"
        "    with open(os.environ['FAKE_WANDB_LOG'], 'a') as f:\n"
        "        f.write(json.dumps({'kind': kind, 'rank': os.environ.get('RANK'), **kw}) + '\\n')\n"
        "class _Run:\n"
        "    summary = {}\n"
        "    def log(self, data, step): _write('log', step=step)\n"
        "    def finish(self): _write('finish')\n"
        "def init(**kw):\n"
        "    _write('init', id=kw['id'])\n"
        "    return _Run()\n")
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "FAKE_WANDB_LOG": str(log), "PYTHONPATH": f"{fake.parent}{os.pathsep}{ROOT}"}
    cmd = [sys.executable, "-m", "mimo", "train", str(DEMO), *TINY, f"--run.out_dir={tmp_path}", "--nproc=2",
           "--train.steps=3", "--metrics.wandb=true"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {c["rank"] for c in calls} == {"0"}
    assert [c["kind"] for c in calls] == ["init", "log", "log", "log", "finish"]
    assert [c["step"] for c in calls if c["kind"] == "log"] == [0, 1, 2]
