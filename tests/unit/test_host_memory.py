"""train.host_mmap_threshold_mb: freed tensors of a few MiB go back to the system at once, where glibc's rising
default threshold keeps them resident in its heap."""

import subprocess
import sys
from pathlib import Path

import pytest

from mimo.config.load import load_config
from mimo.config.schema import ConfigError
from mimo.train.host_memory import set_mmap_threshold

ROOT = Path(__file__).resolve().parents[2]
# glibc's threshold rises to 16 MiB once a 16 MiB mapped block is freed; then 8 MiB tensors come from the heap.
# A small tensor allocated after each pins it between its neighbours, so freeing them cannot trim the heap.
SCRIPT = """
import sys, torch
from mimo.train.host_memory import set_mmap_threshold
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS:')).split()[1]) * 1024
set_mmap_threshold(int(sys.argv[1]))
big = torch.ones(4 << 20); del big
blocks, pins = [], []
for _ in range(12):
    blocks.append(torch.ones(2 << 20))
    pins.append(torch.ones(1024))
held = rss()
del blocks
print(held - rss())
"""


def _returned_bytes(megabytes: int) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(megabytes)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc")
def test_a_fixed_threshold_returns_freed_tensors_and_the_default_does_not():
    assert set_mmap_threshold(0) is False
    freed = 12 * 8 * 2**20
    assert _returned_bytes(1) >= 0.9 * freed
    assert _returned_bytes(0) <= 0.1 * freed


def test_the_threshold_is_refused_beyond_what_glibc_takes():
    with pytest.raises(ConfigError, match="train.host_mmap_threshold_mb = 33"):
        load_config(None, ["--train.host_mmap_threshold_mb=33"])
