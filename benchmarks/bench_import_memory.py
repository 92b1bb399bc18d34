"""Peak resident memory of importing a Hugging Face checkpoint with `mimo.hf.import_llm`, against its size
on disk.

    python -m benchmarks.bench_import_memory --dir /tmp/qwen2_05b [--dtype auto|bfloat16|float32]

With no checkpoint in `--dir`, a random one of Qwen2-0.5B's shapes (494 M parameters, tied embedding) is
written there first, in bf16, by a separate process (nothing is downloaded). The import then runs in a
fresh process, which reports its resident memory before the import (Python, torch and mimo loaded) and its
peak (VmHWM) after it, both against the bytes of the checkpoint's safetensors files
(tests/support/import_memory.py, which the tests share).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tests.support.import_memory import measure_in_fresh_process

QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                 rms_norm_eps=1e-6, tie_word_embeddings=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="checkpoint folder (a random Qwen2-0.5B is made if empty)")
    ap.add_argument("--dtype", default="auto", help="auto (the checkpoint's), bfloat16, float32, ...")
    args = ap.parse_args(argv)
    if not (args.dir / "config.json").is_file():
        subprocess.run([sys.executable, "-c", "import sys, json; from pathlib import Path; "
                        "from tests.support.import_memory import write_random_checkpoint as w; "
                        "w(Path(sys.argv[1]), json.loads(sys.argv[2]))", str(args.dir), json.dumps(QWEN2_05B)],
                       check=True)
    print(json.dumps(measure_in_fresh_process(args.dir, args.dtype), indent=2))


if __name__ == "__main__":
    main()
