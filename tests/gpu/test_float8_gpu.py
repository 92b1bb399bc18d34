"""`precision.module_dtype.language = "float8"` on a GPU with FP8 (compute capability >= 8.9) through torchao: the
LM's projections become torchao's Float8Linear and the tiny demo trains like its bf16 run. Marked `gpu`; skipped
where there is no such GPU or no torchao (carry its wheel to the GPU machine).

    python3 -m pytest -q tests/gpu/test_float8_gpu.py      # on the GPU machine
"""

import math

import pytest
import torch

from mimo.train.trainer import Trainer
from tests.support.tiny_run import metrics, tiny_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs an FP8 GPU")]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_lm_trains_like_bf16_on_the_gpu(recipe, tmp_path):
    float8_linear = pytest.importorskip("torchao.float8.float8_linear").Float8Linear
    # fuse_qkv off (it is on by default on a GPU): q, k and v are then separate linears, converted too.
    common = ["--train.device=cuda", "--precision.dtype=bfloat16", "--train.steps=30", "--perf.fuse_qkv=false"]
    Trainer(tiny_config(tmp_path / "bf16", *common)).train()
    trainer = Trainer(tiny_config(tmp_path / "fp8", *common, "--precision.module_dtype.language=float8",
                                  f"--precision.float8_recipe={recipe}"))
    converted = [n for n, m in trainer.model.named_modules() if isinstance(m, float8_linear)]
    assert len(converted) == 7 and all(n.startswith("language_model.layers.0.") for n in converted)
    trainer.train()
    bf16, fp8 = ([r["loss"] for r in metrics(tmp_path / d) if "loss" in r] for d in ("bf16", "fp8"))
    assert len(fp8) == len(bf16) == 30 and all(math.isfinite(x) for x in fp8)
    gap = max(abs(a - b) / b for a, b in zip(fp8, bf16))
    print(f"{recipe}: loss {fp8[0]:.4f} -> {fp8[-1]:.4f} (bf16 {bf16[0]:.4f} -> {bf16[-1]:.4f}), max rel gap {gap:.2e}")
    assert gap < 0.05 and fp8[-1] < 0.9 * fp8[0]
