"""Peak resident memory of importing a Hugging Face checkpoint with `mimo.hf.import_llm`, against its size
on disk.

    python -m benchmarks.bench_import_memory --dir /tmp/qwen2_05b [--dtype auto|bfloat16|float32]

With no checkpoint in `--dir`, a random one of Qwen2-0.5B's shapes (494 M parameters, tied embedding) is
written there first, in bf16, by a separate process (nothing is downloaded). The import then runs in a
fresh process, which reports its resident memory before the import (Python, torch and mimo loaded) and its
peak (VmHWM) after it, both against the bytes of the checkpoint's safetensors files.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                 rms_norm_eps=1e-6, tie_word_embeddings=True)


def write_random_checkpoint(directory: Path, shapes: dict) -> None:
    """config.json + model.safetensors of a random bf16 Qwen2 with `shapes`, under transformers' names."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config

    from mimo.hf.config import llm_config_from_hf
    from mimo.hf.names import llm_names
    from mimo.models.llm import DecoderLM

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


def measure(directory: Path, dtype: str) -> dict:
    """Run in a fresh process: resident memory before and at the peak of the import."""
    import torch

    from mimo.hf import import_llm

    before = status_bytes("VmRSS")
    lm = import_llm(directory, dtype=dtype)
    peak = status_bytes("VmHWM")
    disk = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    params = sum(p.numel() for p in lm.parameters())
    return {"params": params, "dtype": str(next(lm.parameters()).dtype).removeprefix("torch."),
            "disk_gib": disk / 2**30, "rss_before_gib": before / 2**30, "peak_rss_gib": peak / 2**30,
            "peak_over_disk": peak / disk, "import_over_disk": (peak - before) / disk,
            "torch": torch.__version__}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="checkpoint folder (a random Qwen2-0.5B is made if empty)")
    ap.add_argument("--dtype", default="auto", help="auto (the checkpoint's), bfloat16, float32, ...")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.dir, args.dtype)))
        return
    if not (args.dir / "config.json").is_file():
        subprocess.run([sys.executable, "-c", "import sys, json; from pathlib import Path; "
                        "from benchmarks.bench_import_memory import write_random_checkpoint as w; "
                        "w(Path(sys.argv[1]), json.loads(sys.argv[2]))", str(args.dir), json.dumps(QWEN2_05B)],
                       check=True)
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_import_memory", "--measure", "--dir",
                          str(args.dir), "--dtype", args.dtype], check=True, capture_output=True, text=True)
    print(json.dumps(json.loads(out.stdout.strip().splitlines()[-1]), indent=2))


if __name__ == "__main__":
    main()
