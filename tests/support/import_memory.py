"""A random Qwen2 checkpoint of given shapes, and the peak resident memory of importing one with
`mimo.hf.import_llm` in a fresh process. Shared by tests/unit/test_hf_dtype.py and
benchmarks/bench_import_memory.py (so that no test imports a benchmark).

    python -m tests.support.import_memory --dir DIR [--dtype auto|bfloat16|float32]

prints, as one JSON line, what `measure` returns for the checkpoint in DIR.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from mimo.hf import import_llm
from mimo.hf.config import llm_config_from_hf
from mimo.hf.names import llm_names
from mimo.models.llm import DecoderLM

ROOT = Path(__file__).resolve().parents[2]


def write_random_checkpoint(directory: Path, shapes: dict) -> None:
    """config.json + model.safetensors of a random bf16 Qwen2 with `shapes` (Qwen2Config's keyword
    arguments), under transformers' names."""
    from transformers import Qwen2Config

    config = Qwen2Config(**shapes, dtype="bfloat16")
    config.architectures = ["Qwen2ForCausalLM"]
    with torch.device("meta"):
        lm = DecoderLM(llm_config_from_hf(config.to_dict()))
    gen = torch.Generator().manual_seed(0)
    tensors = {hf: (torch.randn(p.shape, generator=gen) * 0.02).to(torch.bfloat16)
               for (ours, hf), p in zip(llm_names(lm).items(), lm.state_dict().values())}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(directory)


def status_bytes(field: str) -> int:
    """A `/proc/self/status` figure (VmRSS: resident now, VmHWM: its peak) in bytes. Not `ru_maxrss`, which
    Linux carries over an exec from the process that forked this one."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


HEAVY_MODULES = ("torch._dynamo", "torch.distributed.tensor")
"""Modules a plain import must not load: together 0.14 GiB resident before a single weight is read."""


def measure(directory: Path, dtype: str) -> dict:
    """Resident memory before and at the peak of the import, against the checkpoint's safetensors bytes, and
    which of `HEAVY_MODULES` are loaded after it. Meaningful only as the first import of a fresh process
    (`measure_in_fresh_process`)."""
    before = status_bytes("VmRSS")
    lm = import_llm(directory, dtype=dtype)
    peak = status_bytes("VmHWM")
    disk = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    params = sum(p.numel() for p in lm.parameters())
    return {"params": params, "dtype": str(next(lm.parameters()).dtype).removeprefix("torch."),
            "disk_gib": disk / 2**30, "rss_before_gib": before / 2**30, "peak_rss_gib": peak / 2**30,
            "peak_over_disk": peak / disk, "import_over_disk": (peak - before) / disk,
            "heavy_modules": [m for m in HEAVY_MODULES if m in sys.modules], "torch": torch.__version__}


def measure_in_fresh_process(directory: Path, dtype: str = "auto", timeout: float | None = None) -> dict:
    """`measure` run in a new Python process (this module's command line)."""
    out = subprocess.run([sys.executable, "-m", "tests.support.import_memory", "--dir", str(directory),
                          "--dtype", dtype], check=True, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    print(json.dumps(measure(args.dir, args.dtype)))
